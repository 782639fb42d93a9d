package main

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/auth"
)

// certCmd makes the CA, certificates, gossip keys and tokens of a secured
// cluster. It works offline, on files only.
func (a *app) certCmd() *cobra.Command {
	var dir string
	var validity time.Duration
	cmd := &cobra.Command{
		Use:   "cert",
		Short: "Make a CA, node/admin/client certificates, gossip keys and tokens (offline)",
		Long: `cert makes the files a secured cluster runs with (docs/security.md). It
touches only files in --dir and never replaces one.

A certificate's role is its organizational unit:
  node    cluster members; the only role admitted to Raft
  admin   operators: node add/remove, shard transfer, queue purge, and all task calls
  proxy   taskproxy; speaks to the nodes for its authenticated callers
  client  task calls (Modify, Claim, Tasks, Queues), and Status/Routing`,
		Example: `  # everything for a local 3-node cluster, in ./certs
  taskctl cert local --dir certs

  # or step by step
  taskctl cert ca --dir certs
  taskctl cert issue node n1 --dir certs --host 10.0.0.1,n1.internal
  taskctl cert issue admin alice --dir certs
  taskctl cert gossip-key > certs/gossip.key`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&dir, "dir", "certs", "directory of the CA and the certificates")
	pf.DurationVar(&validity, "validity", 365*24*time.Hour, "how long certificates stay valid (the CA: ten times this)")

	caCmd := &cobra.Command{
		Use:   "ca",
		Short: "Make a new CA (DIR/ca.pem, DIR/ca-key.pem)",
		Long: `ca makes a self-signed ECDSA P-256 certificate authority. Every node, proxy,
admin and client certificate of the cluster is issued from it, and every
process gets DIR/ca.pem as --tls-ca. Keep ca-key.pem offline once the
certificates are issued.`,
		Example: `  taskctl cert ca --dir certs --validity 8760h`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ca, err := auth.NewCA("taskstore CA", 10*validity)
			if err != nil {
				return err
			}
			if err := ca.Save(dir); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "wrote %s and %s (keep the key offline)\n", filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem"))
			return nil
		},
	}
	var hosts []string
	issueCmd := &cobra.Command{
		Use:   "issue ROLE NAME",
		Short: "Issue a certificate signed by DIR/ca.pem (DIR/NAME.pem, DIR/NAME-key.pem)",
		Long: `issue signs a certificate for ROLE (node, admin, proxy or client) named NAME.
A node's or proxy's --host list must hold every name and address clients
dial it by (127.0.0.1 and localhost are always added).`,
		Example: `  taskctl cert issue node n4 --dir certs --host 10.0.0.4,n4.internal
  taskctl cert issue proxy proxy-a --dir certs --host proxy-a.internal
  taskctl cert issue admin alice --dir certs`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ca, err := auth.LoadCA(dir)
			if err != nil {
				return err
			}
			is, err := ca.Issue(args[0], args[1], append([]string{"127.0.0.1", "::1", "localhost"}, hosts...), validity)
			if err != nil {
				return err
			}
			if err := is.Save(dir, args[1]); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "wrote %s (role %s)\n", filepath.Join(dir, args[1]+".pem"), args[0])
			return nil
		},
	}
	issueCmd.Flags().StringSliceVar(&hosts, "host", nil, "DNS names and IP addresses for the certificate, comma-separated")

	keyCmd := &cobra.Command{
		Use:   "gossip-key",
		Short: "Print a new random gossip key (base64, 32 bytes) for --gossip-key or --gossip-key-file",
		Long: `gossip-key prints 32 random bytes in base64: an AES-256 key for memberlist.
Every node needs the same key; docs/security.md shows how to rotate it
without a node dropping out.`,
		Example: `  taskctl cert gossip-key > certs/gossip.key`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(a.stdout, randomB64(32))
			return nil
		},
	}
	tokenCmd := &cobra.Command{
		Use:   "token",
		Short: "Print a new random bearer token for an --auth-tokens file",
		Long: `token prints 24 random bytes in hex. Add it to the --auth-tokens file of every
node and proxy with a role (and, for a client, queue prefixes), and give it
to the caller in a file for --token-file.`,
		Example: `  echo "$(taskctl cert token) client jobs/ job-workers" >> certs/tokens`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(a.stdout, randomHex(24))
			return nil
		},
	}
	var nodes []string
	localCmd := &cobra.Command{
		Use:   "local",
		Short: "Make everything a secured local cluster needs, in DIR",
		Long: `local makes, in --dir: a CA; node certificates for --nodes; certificates
admin (role admin), proxy (role proxy) and client (role client); gossip.key;
and tokens (an --auth-tokens file) with an admin token and a client token
limited to queues under demo/, also written alone to admin.token and
client.token (for taskctl --token-file).`,
		Example: `  taskctl cert local --dir certs --nodes n1,n2,n3   # what 'make certs' runs`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ca, err := auth.NewCA("taskstore CA", 10*validity)
			if err != nil {
				return err
			}
			if err := ca.Save(dir); err != nil {
				return err
			}
			local := []string{"127.0.0.1", "::1", "localhost"}
			issue := func(role, name string) error {
				is, err := ca.Issue(role, name, append(local, name), validity)
				if err != nil {
					return err
				}
				return is.Save(dir, name)
			}
			for _, n := range nodes {
				if err := issue(auth.RoleNode, n); err != nil {
					return err
				}
			}
			for _, r := range []string{auth.RoleAdmin, auth.RoleProxy, auth.RoleClient} {
				if err := issue(r, r); err != nil {
					return err
				}
			}
			adminTok, clientTok := randomHex(24), randomHex(24)
			files := map[string]string{
				"gossip.key":   randomB64(32) + "\n",
				"admin.token":  adminTok + "\n",
				"client.token": clientTok + "\n",
				"tokens": "# TOKEN ROLE [QUEUE-PREFIXES] [NAME]  (taskstored/taskproxy --auth-tokens)\n" +
					adminTok + " admin * admin-token\n" + clientTok + " client demo/ demo-client\n",
			}
			for name, content := range files {
				p := filepath.Join(dir, name)
				if _, err := os.Stat(p); err == nil {
					return fmt.Errorf("%s exists; not replacing it", p)
				}
				if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
					return err
				}
			}
			fmt.Fprintf(a.stdout, "wrote a CA, certificates for %s, admin, proxy and client, gossip.key and tokens in %s\n",
				strings.Join(nodes, ", "), dir)
			return nil
		},
	}
	localCmd.Flags().StringSliceVar(&nodes, "nodes", []string{"n1", "n2", "n3"}, "node ids to make node certificates for")
	cmd.AddCommand(caCmd, issueCmd, keyCmd, tokenCmd, localCmd)
	return cmd
}

func randomB64(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
