package main

// --baseline postgres: the same workloads against a PostgreSQL queue table
// claimed with FOR UPDATE SKIP LOCKED, the usual way to build a job queue on
// one PostgreSQL server, so that the target "at least 3x a single PostgreSQL"
// can be measured side by side on the same machine.
//
// The driver is github.com/jackc/pgx/v5 with its pool, pgxpool: it is the
// most used and actively maintained pure-Go PostgreSQL driver (lib/pq is in
// maintenance mode and recommends pgx), it needs no cgo (our binaries are
// built with CGO_ENABLED=0), it caches prepared statements per connection
// by default (so the baseline pays no re-parsing a real application would
// not pay either), and pgxpool sizes the pool exactly to --clients.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// pgTable is the queue table. With --pg-dsn it is created if missing and
// shared by runs; each run's queues have their own prefix and its rows are
// deleted afterwards.
const pgTable = "taskbench_tasks"

// pgLease is how long a claim holds a task, as Taskstore's default lease
// (rpc.DefaultLease).
const pgLease = 30 * time.Second

// A fair queue table: the fields a claim and a commit need, a bigint
// identity key (cheaper than Taskstore's string ids), and one index that
// serves the claim's ORDER BY directly.
var pgSchema = []string{
	`CREATE TABLE IF NOT EXISTS ` + pgTable + ` (
		id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		queue    text        NOT NULL,
		priority integer     NOT NULL DEFAULT 0,
		at       timestamptz NOT NULL DEFAULT now(),
		claimant text        NOT NULL DEFAULT '',
		version  bigint      NOT NULL DEFAULT 1,
		value    bytea       NOT NULL
	)`,
	`CREATE INDEX IF NOT EXISTS ` + pgTable + `_claim ON ` + pgTable + ` (queue, priority DESC, at, id)`,
}

var (
	pgInsertOne = `INSERT INTO ` + pgTable + ` (queue, value) VALUES ($1, $2)`
	// One statement, one transaction, n rows: the equivalent of one Modify
	// with n inserts.
	pgInsertMany = `INSERT INTO ` + pgTable + ` (queue, value) SELECT $1, v FROM unnest($2::bytea[]) AS v`
	// A claim is one transaction: pick the best available task of the queue
	// (highest priority, oldest at, lowest id) that no other transaction has
	// locked, take it for the lease, and bump its version.
	pgClaim = `UPDATE ` + pgTable + ` SET claimant = $2, at = now() + interval '` +
		fmt.Sprint(int(pgLease.Seconds())) + ` seconds', version = version + 1
		WHERE id = (SELECT id FROM ` + pgTable + ` WHERE queue = $1 AND at <= now()
			ORDER BY priority DESC, at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING id, version, queue`
	// --claim-limit N: the same for up to $3 tasks. The ids are picked
	// once (an ARRAY subquery is an InitPlan): "WHERE id IN (SELECT ...
	// SKIP LOCKED)" may be run as a semi-join that evaluates the subquery
	// more than once and so claims more than $3.
	pgClaimMany = `UPDATE ` + pgTable + ` SET claimant = $2, at = now() + interval '` +
		fmt.Sprint(int(pgLease.Seconds())) + ` seconds', version = version + 1
		WHERE id = ANY(ARRAY(SELECT id FROM ` + pgTable + ` WHERE queue = $1 AND at <= now()
			ORDER BY priority DESC, at, id LIMIT $3 FOR UPDATE SKIP LOCKED))
		RETURNING id, version, queue`
	// Commit at most once: a delete or move names id AND version, so a
	// holder of an older version (an expired lease, a duplicate) changes
	// nothing.
	pgDelete = `DELETE FROM ` + pgTable + ` WHERE id = $1 AND version = $2`
	// A move ends the claim and makes the task available now in its new
	// queue, as a Taskstore change with a new queue does.
	pgMove = `UPDATE ` + pgTable + ` SET queue = $3, claimant = '', at = now(), version = version + 1
		WHERE id = $1 AND version = $2`
	// Several claimed tasks in one statement (--claim-limit), all or
	// nothing like a Modify: when fewer rows match than were named, the
	// final SELECT divides by zero, which fails the statement and so undoes
	// it (SQLSTATE 22012, reported as FailedPrecondition).
	pgDeleteMany = `WITH done AS (DELETE FROM ` + pgTable + ` t USING unnest($1::bigint[], $2::bigint[]) AS w(id, version)
		WHERE t.id = w.id AND t.version = w.version RETURNING 1)
		SELECT 1 / (count(*) = cardinality($1::bigint[]))::int FROM done`
	pgMoveMany = `WITH done AS (UPDATE ` + pgTable + ` t SET queue = w.queue, claimant = '', at = now(), version = t.version + 1
		FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS w(id, version, queue)
		WHERE t.id = w.id AND t.version = w.version RETURNING 1)
		SELECT 1 / (count(*) = cardinality($1::bigint[]))::int FROM done`
)

// pgStore is one pool of connections to the baseline's database.
type pgStore struct {
	pool     *pgxpool.Pool
	claimant string
	metered  []meteredProc // a --local server's processes (cost.go)
}

// openPG connects with a pool of exactly conns connections, opens them all
// (so connecting is never measured) and creates the table if needed.
func openPG(ctx context.Context, dsn string, conns int) (*pgStore, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("--pg-dsn: %w", err)
	}
	pc.MaxConns = int32(conns)
	pc.MinConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	s := &pgStore{pool: pool, claimant: "taskbench-" + randomID()}
	held := make([]*pgxpool.Conn, 0, conns)
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %w", err)
		}
		held = append(held, c)
	}
	for _, q := range pgSchema {
		if _, err := held[0].Exec(ctx, q); err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: create the queue table: %w", err)
		}
	}
	return s, nil
}

func (s *pgStore) close() { s.pool.Close() }

func (s *pgStore) insert(ctx context.Context, queue string, value []byte, n int) error {
	if n == 1 {
		_, err := s.pool.Exec(ctx, pgInsertOne, queue, value)
		return err
	}
	vals := make([][]byte, n)
	for i := range vals {
		vals[i] = value
	}
	_, err := s.pool.Exec(ctx, pgInsertMany, queue, vals)
	return err
}

// pgTask is a claimed task version.
type pgTask struct {
	id      int64
	version int64
	queue   string
}

// claim claims up to n of the best available tasks of queue; none when
// the queue has nothing available.
func (s *pgStore) claim(ctx context.Context, queue string, n int) ([]pgTask, error) {
	if n == 1 {
		var t pgTask
		err := s.pool.QueryRow(ctx, pgClaim, queue, s.claimant).Scan(&t.id, &t.version, &t.queue)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return []pgTask{t}, nil
	}
	rows, err := s.pool.Query(ctx, pgClaimMany, queue, s.claimant, n)
	if err != nil {
		return nil, err
	}
	var t pgTask
	ts := make([]pgTask, 0, n)
	_, err = pgx.ForEachRow(rows, []any{&t.id, &t.version, &t.queue}, func() error {
		ts = append(ts, t)
		return nil
	})
	return ts, err
}

// errStale is what Taskstore answers a stale or missing reference with.
func errStale(op string, id, version int64) error {
	return status.Errorf(codes.FailedPrecondition, "%s: task %d version %d is missing or stale", op, id, version)
}

// pgDivisionByZero is the SQLSTATE pgDeleteMany and pgMoveMany raise on
// purpose when a task is missing or stale.
const pgDivisionByZero = "22012"

// errStaleMany reports a multi-task delete or move that named a missing or
// stale task, and so changed nothing.
func errStaleMany(op string, n int, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == pgDivisionByZero {
		return status.Errorf(codes.FailedPrecondition, "%s of %d tasks: one or more are missing or stale; nothing changed", op, n)
	}
	return err
}

// delete deletes the claimed tasks, all or none (one statement).
func (s *pgStore) delete(ctx context.Context, ts []pgTask) error {
	if len(ts) == 1 {
		tag, err := s.pool.Exec(ctx, pgDelete, ts[0].id, ts[0].version)
		if err == nil && tag.RowsAffected() != 1 {
			err = errStale("delete", ts[0].id, ts[0].version)
		}
		return err
	}
	ids, versions := refs(ts)
	_, err := s.pool.Exec(ctx, pgDeleteMany, ids, versions)
	return errStaleMany("delete", len(ts), err)
}

// move moves each claimed task to queues[i], all or none (one statement).
func (s *pgStore) move(ctx context.Context, ts []pgTask, queues []string) error {
	if len(ts) == 1 {
		tag, err := s.pool.Exec(ctx, pgMove, ts[0].id, ts[0].version, queues[0])
		if err == nil && tag.RowsAffected() != 1 {
			err = errStale("move", ts[0].id, ts[0].version)
		}
		return err
	}
	ids, versions := refs(ts)
	_, err := s.pool.Exec(ctx, pgMoveMany, ids, versions, queues)
	return errStaleMany("move", len(ts), err)
}

// commitAndClaim deletes ts (or, with queues, moves ts[i] to queues[i]),
// all or none, then claims up to n tasks of queue, in one transaction and
// one round trip: pgx sends the two statements as one pipelined batch,
// which PostgreSQL runs in one implicit transaction. A stale or missing
// task fails the first statement, which aborts the transaction: nothing is
// claimed, as when a Modify is refused.
func (s *pgStore) commitAndClaim(ctx context.Context, ts []pgTask, queues []string, queue string, n int) ([]pgTask, error) {
	op := "delete"
	ids, versions := refs(ts)
	b := &pgx.Batch{}
	if queues != nil {
		op = "move"
		b.Queue(pgMoveMany, ids, versions, queues)
	} else {
		b.Queue(pgDeleteMany, ids, versions)
	}
	b.Queue(pgClaimMany, queue, s.claimant, n)
	br := s.pool.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, errStaleMany(op, len(ts), err)
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, err
	}
	var t pgTask
	claimed := make([]pgTask, 0, n)
	if _, err := pgx.ForEachRow(rows, []any{&t.id, &t.version, &t.queue}, func() error {
		claimed = append(claimed, t)
		return nil
	}); err != nil {
		br.Close()
		return nil, err
	}
	// Close reports the commit's outcome.
	if err := br.Close(); err != nil {
		return nil, err
	}
	return claimed, nil
}

// refs splits claimed tasks into the id and version arrays the statements take.
func refs(ts []pgTask) (ids, versions []int64) {
	ids, versions = make([]int64, len(ts)), make([]int64, len(ts))
	for i, t := range ts {
		ids[i], versions[i] = t.id, t.version
	}
	return ids, versions
}

// count returns how many tasks the queues hold.
func (s *pgStore) count(ctx context.Context, queues []string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+pgTable+` WHERE queue = ANY($1)`, queues).Scan(&n)
	return n, err
}

// purge deletes the queues' tasks (a --pg-dsn run cleans up after itself).
func (s *pgStore) purge(ctx context.Context, queues []string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM `+pgTable+` WHERE queue = ANY($1)`, queues)
	return err
}

// pgCounters are the server's totals that stand for "log entries".
type pgCounters struct {
	walSyncs float64 // pg_stat_wal.wal_sync: fsyncs of the WAL
	commits  float64 // pg_stat_database.xact_commit of this database
}

// counters reads pg_stat_wal and pg_stat_database. Backends publish their
// statistics when idle, at most once a second; so first every pooled
// connection asks for its own to be flushed (PostgreSQL 15+), which happens
// before it reports ready for the next query.
func (s *pgStore) counters(ctx context.Context) (pgCounters, error) {
	for _, c := range s.pool.AcquireAllIdle(ctx) {
		c.Exec(ctx, `SELECT pg_stat_force_next_flush()`) // older servers: counts may lag by a second
		c.Release()
	}
	var pc pgCounters
	err := s.pool.QueryRow(ctx, `SELECT (SELECT wal_sync FROM pg_stat_wal)::float8,
		(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())::float8`).Scan(&pc.walSyncs, &pc.commits)
	if err != nil {
		return pc, fmt.Errorf("pg_stat_wal (PostgreSQL 14+): %w", err)
	}
	return pc, nil
}

// pgCode names a PostgreSQL error by its SQLSTATE in the error counts.
func pgCode(err error) (string, bool) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return "SQLSTATE " + pe.Code, true
	}
	return "", false
}

// pgInsert is insert against PostgreSQL.
func (w *worker) pgInsert(ctx context.Context, n int) error {
	q := w.queue()
	err := w.rpc(ctx, "insert", func(ctx context.Context) error {
		return w.pg.insert(ctx, q, w.value, n)
	})
	if err == nil {
		w.tasks += int64(n)
	}
	return err
}

// pgClaimThen is claimThen against PostgreSQL: two transactions, as
// against Taskstore two RPCs.
func (w *worker) pgClaimThen(ctx context.Context, move bool) error {
	ts := w.pgHeld
	w.pgHeld = nil
	if len(ts) == 0 {
		q := w.queue()
		err := w.rpc(ctx, "claim", func(ctx context.Context) error {
			var err error
			ts, err = w.pg.claim(ctx, q, w.cfg.claim)
			return err
		})
		if err != nil {
			return err
		}
		if len(ts) == 0 {
			w.empty++
			return nil
		}
	}
	var err error
	if !w.cfg.twoCalls {
		// The shape of a Modify with a claim: one transaction.
		var queues []string
		kind := "delete+claim"
		if move {
			kind, queues = "move+claim", make([]string, len(ts))
			for i, t := range ts {
				queues[i] = w.lay.next[t.queue]
			}
		}
		err = w.rpc(ctx, kind, func(ctx context.Context) error {
			var err error
			w.pgHeld, err = w.pg.commitAndClaim(ctx, ts, queues, ts[0].queue, w.cfg.claim)
			return err
		})
	} else if move {
		queues := make([]string, len(ts))
		for i, t := range ts {
			queues[i] = w.lay.next[t.queue]
		}
		err = w.rpc(ctx, "move", func(ctx context.Context) error {
			return w.pg.move(ctx, ts, queues)
		})
	} else {
		err = w.rpc(ctx, "delete", func(ctx context.Context) error {
			return w.pg.delete(ctx, ts)
		})
	}
	if err == nil {
		w.tasks += int64(len(ts))
	}
	return err
}

// batchInsert is prefill's insert for PostgreSQL.
func (s *pgStore) batchInsert(value []byte) func(ctx context.Context, queue string, n int) error {
	return func(ctx context.Context, queue string, n int) error { return s.insert(ctx, queue, value, n) }
}

// pgEndpoint describes where dsn points, without its password.
func pgEndpoint(dsn string) string {
	c, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "?"
	}
	host := c.Host
	if strings.HasPrefix(host, "/") {
		return fmt.Sprintf("%s/.s.PGSQL.%d db=%s", host, c.Port, c.Database)
	}
	return fmt.Sprintf("%s:%d db=%s", host, c.Port, c.Database)
}

// benchPostgres is bench for --baseline postgres.
func benchPostgres(ctx context.Context, cfg *config, stderr io.Writer, getenv func(string) string) (*result, error) {
	dsn := cfg.pgDSN
	text := cfg.output == "text"
	var metered []meteredProc
	if cfg.local != 0 {
		if text {
			fmt.Fprintf(stderr, "starting a local PostgreSQL...\n")
		}
		srv, err := startLocalPostgres(ctx, cfg.clients+10, getenv)
		if err != nil {
			return nil, err
		}
		defer srv.stop()
		dsn = srv.dsn
		metered = srv.metered()
	}
	s, err := openPG(ctx, dsn, cfg.clients)
	if err != nil {
		return nil, err
	}
	s.metered = metered
	defer s.close()
	lay := newLayout(cfg)
	if cfg.local == 0 {
		defer s.purge(context.WithoutCancel(ctx), lay.queues)
	}
	return runPG(ctx, cfg, s, lay, pgEndpoint(dsn), stderr)
}

// runPG prefills, measures and tallies against an open store.
func runPG(ctx context.Context, cfg *config, s *pgStore, lay layout, endpoint string, stderr io.Writer) (*result, error) {
	text := cfg.output == "text"
	value := make([]byte, cfg.valueSize)
	rand.Read(value)
	if cfg.prefill > 0 {
		if text {
			fmt.Fprintf(stderr, "prefilling %d tasks over %d queues...\n", cfg.prefill, len(lay.queues))
		}
		if err := prefill(ctx, cfg, lay, cfg.prefill, s.batchInsert(value)); err != nil {
			return nil, err
		}
	}
	// What a DBA does after a bulk load: visibility map and planner
	// statistics up to date before the clock starts (autovacuum stays on).
	if _, err := s.pool.Exec(ctx, `VACUUM ANALYZE `+pgTable); err != nil {
		return nil, fmt.Errorf("vacuum: %w", err)
	}
	res := newResult(cfg, endpoint, len(lay.queues))
	res.Via, res.Baseline = "postgres", "postgres"
	if cfg.local != 0 {
		res.Local = 1
	}
	s.pool.QueryRow(ctx, `SHOW server_version`).Scan(&res.PGVersion)
	before, merr := s.counters(ctx)

	if text {
		fmt.Fprintf(stderr, "running %s against PostgreSQL for %v with %d clients...\n", cfg.workload, cfg.duration, cfg.clients)
	}
	workers := make([]*worker, cfg.clients)
	for i := range workers {
		workers[i] = newWorker(i, nil, cfg, lay, value)
		workers[i].pg = s
	}
	walBefore := s.walBytes(ctx)
	meter := startCosts(s.metered)
	elapsed, err := measure(ctx, cfg, workers)
	meter.stop()
	if err != nil {
		return nil, err
	}
	after, merr2 := s.counters(context.WithoutCancel(ctx))
	res.tally(workers, elapsed)
	secs := elapsed.Seconds()
	if err := errors.Join(merr, merr2); err != nil {
		res.MetricsError = err.Error()
	} else {
		res.setLogEntries(after.walSyncs-before.walSyncs, secs)
		res.PGCommits = after.commits - before.commits
	}
	res.setPGCosts(meter, errors.Join(merr, merr2) == nil, walBefore, s.walBytes(context.WithoutCancel(ctx)))
	return res, nil
}
