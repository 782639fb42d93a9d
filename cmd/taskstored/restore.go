package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/cmd/internal/logging"
)

// restoreCmd is `taskstored restore`.
func restoreCmd() *cobra.Command {
	var (
		from, id, dataDir, initial string
		replicas                   int
		logLevel, logFormat        string
	)
	cmd := &cobra.Command{
		Use:   "restore --from FILE --id ID --data-dir DIR --initial-cluster LIST [--replicas N]",
		Short: "Prepare a node's data directory from a backup, for a new cluster",
		Long: `restore prepares an empty --data-dir from a backup that "taskctl backup
create" wrote, as "etcdutl snapshot restore" does. Run it on every node of the
new cluster with the same --from file and --initial-cluster (and its own --id
and --data-dir), then start each node as usual, with the same --id,
--data-dir and --initial-cluster. The nodes form a NEW cluster (a new cluster
id: a restored node never joins the cluster the backup came from) holding
exactly the backup: every shard's tasks, queues, keys with their dedup
windows, schedules, pauses and limits as of the shard's index in the
backup, and the routing table (slot -> shard). The number of nodes may
differ from the backed-up cluster's (5 backed up, 3 restored): each shard's
replicas are placed over the new nodes as at a bootstrap, --replicas per
shard (default: the backup's, at most the number of nodes).

The whole file is checked (every part's checksum, the manifest, the end); a
damaged or truncated file is refused with the part that is wrong and the
directory is left empty. A --data-dir that holds anything is refused.
Exactly-once records of clients (request ids) are restored with the shards;
clients must reconnect to the new cluster's addresses.`,
		Example: `  # on each of the three new nodes (n2 and n3 alike, with their own --id and --data-dir)
  taskstored restore --from backup-20260101-0300.tsb --id n1 --data-dir /var/lib/taskstore \
    --initial-cluster n1=10.0.0.1:7101,n2=10.0.0.2:7101,n3=10.0.0.3:7101
  taskstored --id n1 --data-dir /var/lib/taskstore --listen 10.0.0.1:7101 ... \
    --initial-cluster n1=10.0.0.1:7101,n2=10.0.0.2:7101,n3=10.0.0.3:7101`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := logging.New(os.Stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			switch {
			case from == "":
				return errors.New("--from is required: the backup file (taskctl backup create), or - for stdin")
			case id == "":
				return errors.New("--id is required")
			case dataDir == "":
				return errors.New("--data-dir is required")
			case initial == "":
				return errors.New("--initial-cluster is required: every node of the new cluster as id=address")
			case replicas < 0:
				return fmt.Errorf("--replicas %d: must not be negative", replicas)
			}
			peers, err := parseInitialCluster(initial)
			if err != nil {
				return err
			}
			var in io.Reader = os.Stdin
			if from != "-" {
				f, err := os.Open(from)
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			start := time.Now()
			res, err := cluster.Restore(cluster.RestoreConfig{ID: id, DataDir: dataDir, InitialCluster: peers, Replicas: replicas, Logger: log}, in)
			if err != nil {
				return fmt.Errorf("restore: %w", err)
			}
			m := res.Manifest
			var shards []string
			for _, s := range res.Shards {
				shards = append(shards, fmt.Sprint(s))
			}
			took := time.Since(start)
			fmt.Fprintf(cmd.OutOrStdout(), "restored %s for node %s of new cluster %s from a backup of cluster %s taken %s: %d shards, %d tasks; this node holds shards %s; read %d MB in %v\n",
				dataDir, id, res.ClusterID, m.ClusterID, m.Started.Format(time.RFC3339), len(m.Shards), m.Tasks(), strings.Join(shards, ","),
				m.Bytes()>>20, took.Round(time.Millisecond))
			fmt.Fprintln(cmd.OutOrStdout(), "Start the node with the same --id, --data-dir and --initial-cluster.")
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&from, "from", "", "the backup file (taskctl backup create); - reads stdin")
	fl.StringVar(&id, "id", "", "this node's id in the new cluster (required)")
	fl.StringVar(&dataDir, "data-dir", "", "the node's data directory: must be empty or absent (required)")
	fl.StringVar(&initial, "initial-cluster", "", "every node of the new cluster as id=listen-address, comma-separated, the same on each node (required)")
	fl.IntVar(&replicas, "replicas", 0, "replicas per shard; 0 keeps the backup's (at most the number of nodes)")
	fl.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}
