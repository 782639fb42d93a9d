package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/backup"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/cmd/internal/buildinfo"
	"github.com/e1158ecb/taskstore/internal/bytesize"
)

// backupWait bounds a whole backup (beyond --timeout).
const backupWait = 24 * time.Hour

// backupCmd is `taskctl backup`.
func (a *app) backupCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "Back up the whole cluster online, and check a backup file",
		Long: `backup create copies every shard's state and the cluster map into one file
while the cluster serves traffic; backup verify checks a file offline.
taskstored restore --from FILE builds a new cluster from it (docs/operations.md
has the runbook). The file holds every task's value: keep it where only
operators can read it.`,
		Example: `  taskctl backup create backup-$(date +%Y%m%d-%H%M).tsb
  taskctl backup verify backup-20260101-0300.tsb
  taskstored restore --from backup-20260101-0300.tsb --id n1 --data-dir data/n1 --initial-cluster ...`,
	}
	cmd.AddCommand(a.backupCreateCmd(), a.backupVerifyCmd())
	return cmd
}

// defaultBackupRate (MB/s) is what a backup reads at unless told: measured
// on a 2-core machine running three nodes and the writers, 55 MB/s copied
// at 53 MB/s with the writers' p99 1.6x of before (and 44 MB/s, 5.2x, in a
// second run), no limit at 76 MB/s with 5.1x (docs/operations.md,
// "Measured").
const defaultBackupRate = 55

func (a *app) backupCreateCmd() *cobra.Command {
	var rate float64
	cmd := &cobra.Command{
		Use:   "create FILE|-",
		Short: "Take an online backup of every shard and the cluster map",
		Long: `backup create copies the cluster map (from the meta leader) and then each
shard's state machine into FILE, while the cluster serves traffic: the
shard's leader redirects the copy to a follower that has applied its commit
index (tried for up to 5 s; else the leader streams it). Each shard's copy is its state as of one Raft index of its
log, taken after a leadership check: every write acknowledged before the
backup began is in it, and nothing after that index is. Transactions never
span shards, so a copy per shard is a consistent backup. Writers of a shard
wait only while its copy takes a view of the state (milliseconds; see
docs/operations.md); the copy then streams while writes go on.

The file has a manifest (cluster id, format, shards with their indexes, slot
ranges and task counts, time) and a CRC-32C over every part and over the
whole file; "taskctl backup verify" checks them. FILE is written as
FILE.partial (mode 0600) and renamed once complete; an existing FILE is
refused; {time} in FILE becomes the UTC time (20260101T030000Z), for
scheduled jobs. With "-" the backup goes to stdout, for a pipe to object storage; a
backup cut short there has no end and every reader refuses it.

A slot move or a shard added or removed while the backup runs makes it fail
(the routing table must be the same at its start and end): run it again.
Needs the admin role. Progress goes to stderr when it is a terminal.`,
		Example: `  taskctl backup create backup-$(date +%Y%m%d-%H%M).tsb
  taskctl backup create /backups/taskstore-{time}.tsb
  taskctl backup create --rate 20 backup.tsb     # at most 20 MB/s (default 55): less CPU taken from writers
  taskctl backup create --rate 0 backup.tsb      # as fast as the copies come
  taskctl backup create - | gzip | aws s3 cp - s3://bucket/taskstore/$(date +%F).tsb.gz`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if rate < 0 {
				return fmt.Errorf("--rate %v: must not be negative", rate)
			}
			return a.backupCreate(args[0], rate)
		},
	}
	cmd.Flags().Float64Var(&rate, "rate", defaultBackupRate, "read the copies at most this many MB/s (0: as fast as they come); a slower copy leaves the nodes' CPU to writers")
	return cmd
}

func (a *app) backupCreate(target string, rate float64) error {
	// {time} in the name: a scheduled job without a shell (the image has
	// none) still names each backup apart.
	target = strings.ReplaceAll(target, "{time}", time.Now().UTC().Format("20060102T150405Z"))
	return a.withClient(backupWait, func(ctx context.Context, c *client.Client) error {
		var out io.Writer = a.stdout
		summary := a.stdout
		var f *os.File
		partial := target + ".partial"
		if target == "-" {
			summary = a.stderr
		} else {
			if _, err := os.Stat(target); err == nil {
				return fmt.Errorf("%s exists: remove it or name another file", target)
			}
			var err error
			if f, err = os.OpenFile(partial, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
				return fmt.Errorf("create the backup file: %w (a %s left by a backup that was cut short can go)", err, partial)
			}
			out = f
		}
		var bs *backgroundSync
		if f != nil {
			bs = newBackgroundSync(f)
			out = bs
		}
		m, err := a.writeBackup(ctx, c, out, rate)
		if f != nil {
			if serr := bs.stop(); err == nil {
				err = serr
			}
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = os.Rename(partial, target)
			}
			if err != nil {
				os.Remove(partial)
			}
		}
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		took := m.Finished.Sub(m.Started)
		fmt.Fprintf(summary, "backup of cluster %s: %d shards, %d tasks, %s in %v (%s/s)\n", m.ClusterID, len(m.Shards), m.Tasks(),
			bytesize.Format(m.Bytes()), took.Round(time.Millisecond), bytesize.Format(uint64(float64(m.Bytes())/max(took.Seconds(), 1e-3))))
		return nil
	})
}

// writeBackup writes a backup to out and returns its manifest.
func (a *app) writeBackup(ctx context.Context, c *client.Client, out io.Writer, rate float64) (*backup.Manifest, error) {
	started := time.Now().UTC()
	mapData, cm, err := backupMap(ctx, c)
	if err != nil {
		return nil, err
	}
	if len(cm.Moves) > 0 {
		return nil, fmt.Errorf("%d slot move(s) in progress (taskctl status shows them): back up once they are done", len(cm.Moves))
	}
	w, err := backup.NewWriter(out)
	if err != nil {
		return nil, err
	}
	pw, err := w.Part(backup.KindMap, 0)
	if err != nil {
		return nil, err
	}
	if _, err := pw.Write(mapData); err != nil {
		return nil, err
	}
	if _, err := pw.Close(); err != nil {
		return nil, err
	}
	m := &backup.Manifest{ClusterID: cm.ClusterId, Version: buildinfo.Version, Started: started, MapEpoch: cm.Epoch,
		ReplicationFactor: cm.ReplicationFactor, Slots: len(cm.Slots)}
	shards := slices.Clone(cm.Shards)
	slices.SortFunc(shards, func(x, y *metapb.Shard) int { return int(x.Id) - int(y.Id) })
	prog := newProgress(a.stderr, w)
	prog.rate = rate * 1e6
	for i, sh := range shards {
		pw, err := w.Part(backup.KindShard, sh.Id)
		if err != nil {
			return nil, err
		}
		prog.begin(fmt.Sprintf("shard %d (%d of %d)", sh.Id, i+1, len(shards)))
		info, err := c.Backup(ctx, sh.Id, prog.wrap(pw))
		if err != nil {
			return nil, fmt.Errorf("shard %d: %w", sh.Id, notServed(err))
		}
		if _, err := pw.Close(); err != nil {
			return nil, err
		}
		if info.ClusterId != cm.ClusterId {
			return nil, fmt.Errorf("shard %d came from cluster %s, the map is cluster %s", sh.Id, info.ClusterId, cm.ClusterId)
		}
		prog.end(fmt.Sprintf("index %d, %d tasks, from %s", info.Index, info.Tasks, info.Node))
		m.Shards = append(m.Shards, backup.ShardInfo{ID: sh.Id, Index: info.Index, Tasks: info.Tasks,
			Slots: backup.SlotRanges(cm.Slots, sh.Id), Node: info.Node})
	}
	// The map again: the shards' copies fit the map only if no slot
	// moved and no shard came or went meanwhile.
	_, after, err := backupMap(ctx, c)
	if err != nil {
		return nil, err
	}
	if !sameRouting(cm, after) {
		return nil, errors.New("the routing table changed while the backup ran (a slot move, or a shard added or removed): run it again")
	}
	m.Finished = time.Now().UTC()
	if err := w.Finish(m); err != nil {
		return nil, err
	}
	return m, nil
}

// backupMap copies the cluster map from the meta leader.
func backupMap(ctx context.Context, c *client.Client) ([]byte, *metapb.ClusterMap, error) {
	var buf bytes.Buffer
	if _, err := c.Backup(ctx, 0, &buf); err != nil {
		return nil, nil, fmt.Errorf("the cluster map: %w", notServed(err))
	}
	cm := &metapb.ClusterMap{}
	if err := proto.Unmarshal(buf.Bytes(), cm); err != nil {
		return nil, nil, fmt.Errorf("the cluster map: %w", err)
	}
	if cm.ClusterId == "" || len(cm.Slots) == 0 {
		return nil, nil, errors.New("the cluster map is not initialised yet")
	}
	return buf.Bytes(), cm, nil
}

// notServed explains an endpoint that does not serve Backup at all (a
// taskproxy from before proxies relayed it).
func notServed(err error) error {
	if status.Code(err) == codes.Unimplemented {
		return fmt.Errorf("%w (the endpoint does not relay backups: point --endpoints at the nodes, or upgrade the proxy)", err)
	}
	return err
}

func sameRouting(a, b *metapb.ClusterMap) bool {
	ids := func(cm *metapb.ClusterMap) []uint32 {
		var s []uint32
		for _, sh := range cm.Shards {
			s = append(s, sh.Id)
		}
		slices.Sort(s)
		return s
	}
	return a.ClusterId == b.ClusterId && slices.Equal(a.Slots, b.Slots) && slices.Equal(ids(a), ids(b)) && len(b.Moves) == 0
}

// syncEvery is how many bytes backgroundSync lets the file take before
// it syncs them.
//
// The backup file often shares a disk with the nodes' Raft logs, which
// fsync every write they acknowledge. On ext4 (data=ordered) a sync of the
// backup allocates its dirty pages into the journal, and a node's fdatasync
// that commits the journal meanwhile waits for those pages to reach the
// disk: a sync every 32 MiB held the writers' p99 at 2.5-3.0x of before
// during a backup at 54 MB/s, a sync every MiB at 1.5-1.8x (the writers'
// p99 11-12 ms against 15-24; taskctl's CPU per MB the same;
// docs/operations.md, "Measured"). A sync that takes longer than a MiB
// of copy lets the next requests coalesce (kick), so a slow disk is
// synced as often as it can be, never waited for by the copy.
const syncEvery = 1 << 20

// backgroundSync writes to a file and syncs it in the background every
// syncEvery bytes, while the copies go on: the last Sync before the rename
// then has a tail to write, not the whole file (147 MB took 0.33 s to sync
// on the 2-core development machine, a sixth of a backup at 78 MB/s), and
// the page cache does not fill with the backup's dirty pages.
type backgroundSync struct {
	f       *os.File
	pending int64
	kick    chan struct{}
	done    chan error
}

func newBackgroundSync(f *os.File) *backgroundSync {
	s := &backgroundSync{f: f, kick: make(chan struct{}, 1), done: make(chan error, 1)}
	go func() {
		var err error
		for range s.kick {
			if err == nil {
				err = f.Sync()
			}
		}
		s.done <- err
	}()
	return s
}

func (s *backgroundSync) Write(p []byte) (int, error) {
	n, err := s.f.Write(p)
	s.pending += int64(n)
	if s.pending >= syncEvery {
		s.pending = 0
		select {
		case s.kick <- struct{}{}: // a sync starts, or one is already asked for
		default:
		}
	}
	return n, err
}

// stop waits for the sync under way and returns the first sync error.
func (s *backgroundSync) stop() error {
	close(s.kick)
	return <-s.done
}

// progress reports a backup's progress on a terminal (stderr), and
// nothing when stderr is not one.
type progress struct {
	out     io.Writer
	tty     bool
	w       *backup.Writer
	start   time.Time
	part    string
	partAt  time.Time
	shown   time.Time
	written int64
	rate    float64 // bytes per second at most; 0: no limit
	copied  int64   // bytes of every copy so far, for rate
}

func newProgress(stderr io.Writer, w *backup.Writer) *progress {
	p := &progress{out: stderr, w: w, start: time.Now()}
	if f, ok := stderr.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progress) begin(part string) { p.part, p.partAt, p.written = part, time.Now(), 0 }

func (p *progress) end(what string) {
	if p.tty {
		fmt.Fprintf(p.out, "\r\033[K%s: %s, %s in %v\n", p.part, what, bytesize.Format(uint64(p.written)), time.Since(p.partAt).Round(time.Millisecond))
	}
}

func (p *progress) wrap(w io.Writer) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		n, err := w.Write(b)
		p.written += int64(n)
		p.copied += int64(n)
		if p.rate > 0 {
			// Reading slower holds the node's stream back (gRPC flow
			// control), so the copy takes less of the leader's CPU.
			if ahead := time.Duration(float64(p.copied)/p.rate*float64(time.Second)) - time.Since(p.start); ahead > 0 {
				time.Sleep(ahead)
			}
		}
		if p.tty && time.Since(p.shown) > 200*time.Millisecond {
			p.shown = time.Now()
			total := p.w.Written()
			fmt.Fprintf(p.out, "\r\033[K%s: %s; backup %s, %s/s", p.part, bytesize.Format(uint64(p.written)), bytesize.Format(uint64(total)),
				bytesize.Format(uint64(float64(total)/max(time.Since(p.start).Seconds(), 1e-3))))
		}
		return n, err
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func (a *app) backupVerifyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "verify FILE",
		Short: "Check a backup file's checksums and manifest, offline",
		Long: `backup verify reads FILE whole, without a cluster: it checks the CRC-32C of
every part and of the whole file, and that the manifest names exactly the
parts the file holds, then prints what the backup holds (cluster, time,
shards with their Raft indexes, slot ranges and task counts). A damaged or
truncated file is refused with the part that is wrong, and the command exits
1. With -o json it prints the manifest. "-" reads stdin.`,
		Example: `  taskctl backup verify backup-20260101-0300.tsb
  aws s3 cp s3://bucket/taskstore/2026-01-01.tsb.gz - | gunzip | taskctl backup verify -`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var in io.Reader = os.Stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			m, err := backup.Verify(in, nil)
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSONValue(a.stdout, m)
			}
			printManifest(a.stdout, m)
			return nil
		},
	}
}

func printManifest(out io.Writer, m *backup.Manifest) {
	fmt.Fprintf(out, "backup OK: cluster %s, format %d, taken %s to %s by %s\n", m.ClusterID, m.Format,
		m.Started.Format(time.RFC3339), m.Finished.Format(time.RFC3339), cmpOr(m.Version, "?"))
	fmt.Fprintf(out, "%d shards, %d tasks, %s of state, %d slots, replication factor %d, map epoch %d\n",
		len(m.Shards), m.Tasks(), bytesize.Format(m.Bytes()), m.Slots, m.ReplicationFactor, m.MapEpoch)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tINDEX\tTASKS\tBYTES\tCRC32C\tFROM\tSLOTS")
	for _, s := range m.Shards {
		slots := s.Slots
		if len(slots) > 40 {
			slots = slots[:strings.LastIndexByte(slots[:40], ',')+1] + "..."
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%08x\t%s\t%s\n", s.ID, s.Index, s.Tasks, bytesize.Format(s.Bytes), s.CRC32C, s.Node, slots)
	}
	tw.Flush()
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
