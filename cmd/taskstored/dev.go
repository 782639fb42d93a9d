package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/cmd/internal/buildinfo"
	"github.com/e1158ecb/taskstore/cmd/internal/logging"
	"github.com/e1158ecb/taskstore/proxy"
	"github.com/e1158ecb/taskstore/rpc"
)

func devCmd() *cobra.Command {
	var dataDir, logLevel string
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a local 3-node cluster in one process (what `make run` runs)",
		Long: `dev starts three nodes on loopback in one process, with their data under
--data-dir (default ./data/dev), so that a restart keeps the tasks:

  n1: gRPC 127.0.0.1:7101  gossip 127.0.0.1:7201  http 127.0.0.1:7301
  n2: gRPC 127.0.0.1:7102  gossip 127.0.0.1:7202  http 127.0.0.1:7302
  n3: gRPC 127.0.0.1:7103  gossip 127.0.0.1:7203  http 127.0.0.1:7303

and one proxy (taskproxy) in front of them:

  proxy: gRPC 127.0.0.1:7000  http 127.0.0.1:7300 (JSON API, docs/http.md)

Ctrl-C stops it gracefully. Remove the data directory to start afresh.`,
		Example: `  taskstored dev
  taskctl --endpoints 127.0.0.1:7101 status
  curl -s 127.0.0.1:7300/v1/queues`,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := logging.New(os.Stderr, logLevel, "text")
			if err != nil {
				return err
			}
			peers := []cluster.Peer{{ID: "n1", Address: "127.0.0.1:7101"}, {ID: "n2", Address: "127.0.0.1:7102"}, {ID: "n3", Address: "127.0.0.1:7103"}}
			var cfgs []cluster.Config
			for i, p := range peers {
				cfgs = append(cfgs, cluster.Config{
					ID: p.ID, DataDir: filepath.Join(dataDir, p.ID), ListenAddr: p.Address,
					GossipAddr: fmt.Sprintf("127.0.0.1:%d", 7201+i), HTTPAddr: fmt.Sprintf("127.0.0.1:%d", 7301+i),
					InitialCluster: peers, Shards: 8, Replicas: 3,
					// Three nodes share this machine's cores: relax timeouts.
					Tuning: cluster.DefaultTuning().Scaled(2), Logger: log, // the node adds node=ID
				})
			}
			ports := []port{{addr: "127.0.0.1:7000", what: "proxy gRPC"}, {addr: "127.0.0.1:7300", what: "proxy HTTP"}}
			for i, c := range cfgs {
				ports = append(ports, port{addr: c.ListenAddr, what: peers[i].ID + " gRPC and Raft"},
					port{addr: c.GossipAddr, what: peers[i].ID + " gossip", udp: true},
					port{addr: c.HTTPAddr, what: peers[i].ID + " HTTP"})
			}
			if err := checkPorts(ports); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, `Taskstore dev cluster: 3 nodes, 8 shards, 3 replicas; data in %s

  export TASKSTORE_ENDPOINTS=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
  taskctl status
  taskctl task insert demo/work --value hello
  taskctl task claim demo/work --lease 30s

Proxy: gRPC 127.0.0.1:7000 (taskctl --proxy --endpoints 127.0.0.1:7000 ...)
       HTTP/JSON http://127.0.0.1:7300 (docs/http.md):
  curl -s -XPOST 127.0.0.1:7300/v1/modify -d '{"inserts":[{"queue":"demo/work","value":"aGVsbG8="}]}'
  curl -s -XPOST 127.0.0.1:7300/v1/claim -d '{"queues":["demo/work"],"claimant":"me","lease":"30s"}'

Status page: http://127.0.0.1:7301/ (any node: 7301, 7302, 7303)
Metrics: http://127.0.0.1:7301/metrics (nodes), http://127.0.0.1:7300/metrics (proxy)   Ctrl-C to stop.

`, dataDir)
			startProxy := func() (func(context.Context) error, error) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				p, err := proxy.Start(ctx, proxy.Config{Version: buildinfo.Version, Cluster: "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103",
					ListenAddr: "127.0.0.1:7000", HTTPAddr: "127.0.0.1:7300", Logger: log}) // the proxy adds component=proxy
				if err != nil {
					return nil, err
				}
				return p.Shutdown, nil
			}
			return run(log, defaultShutdown, startProxy, rpc.NodeOptions{}, cfgs...)
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "data/dev", "where the three nodes keep their data")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}
