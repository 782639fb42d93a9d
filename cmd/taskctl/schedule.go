package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

func (a *app) scheduleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedule",
		Short: "Insert tasks periodically: add, list and remove schedules",
		Long: `schedule groups the commands about periodic schedules. A schedule inserts one
task into its queue at each tick of a cron expression (in a time zone) or of
an interval, exactly once whichever node leads its shard, across leader
changes and restarts. A tick's task has id NAME@TIME (UTC). Ticks missed while
the shard had no leader (found over a minute late) are skipped, or with
--missed once inserted as one task when a leader is back.`,
		Example: `  taskctl schedule add nightly-report --queue reports/run --cron "0 2 * * *" --tz Europe/Berlin
  taskctl schedule add heartbeat --queue ops/ping --every 30s --value ping
  taskctl schedule list
  taskctl schedule remove nightly-report`,
	}

	var (
		queue, cronExpr, zone, value, missed string
		every                                time.Duration
		priority                             int32
	)
	add := &cobra.Command{
		Use:   "add NAME --queue QUEUE (--cron EXPR [--tz ZONE] | --every DURATION)",
		Short: "Create or replace a schedule",
		Long: `schedule add creates the schedule NAME, or replaces the one of that name in
QUEUE's consistency group (keeping its count of ticks fired). --cron takes five
fields (minute hour day-of-month month day-of-week) or a descriptor (@hourly,
@daily, @weekly, @monthly); --tz is its IANA time zone (default UTC). --every
takes an interval of at least 1s instead. Each tick inserts a task with --value
and --priority. --missed says what happens to ticks missed while the shard had
no leader: skip (default) or once (insert one task for them all on recovery).

With -o json it prints the stored Schedule, with its next tick.`,
		Example: `  taskctl schedule add nightly-report --queue reports/run --cron "0 2 * * *" --tz Europe/Berlin
  taskctl schedule add heartbeat --queue ops/ping --every 30s --value ping --missed once`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if queue == "" {
				return fmt.Errorf("--queue is required")
			}
			s := &taskstorepb.Schedule{Name: args[0], Queue: queue, Cron: cronExpr, TimeZone: zone, Value: []byte(value), Priority: priority}
			if every != 0 {
				s.Every = durationpb.New(every)
			}
			switch missed {
			case "skip":
			case "once":
				s.Missed = taskstorepb.MissedTicks_MISSED_TICKS_RUN_ONCE
			default:
				return fmt.Errorf("--missed %q: skip or once", missed)
			}
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				stored, replaced, err := c.PutSchedule(ctx, s)
				if err != nil {
					return apiError("schedule add", "schedule", err)
				}
				if a.output == "json" {
					return printJSON(a.stdout, stored)
				}
				verb := "added"
				if replaced {
					verb = "replaced"
				}
				fmt.Fprintf(a.stdout, "schedule %s %s: next tick %s\n", stored.Name, verb, formatTime(stored.Next))
				return nil
			})
		},
	}
	f := add.Flags()
	f.StringVar(&queue, "queue", "", "the queue each tick inserts a task into")
	f.StringVar(&cronExpr, "cron", "", `cron expression, e.g. "0 2 * * *" or @hourly`)
	f.StringVar(&zone, "tz", "", "the cron expression's time zone (IANA, e.g. Europe/Berlin; default UTC)")
	f.DurationVar(&every, "every", 0, "an interval instead of --cron (at least 1s)")
	f.StringVar(&value, "value", "", "each task's value, as text")
	f.Int32Var(&priority, "priority", 0, "each task's priority")
	f.StringVar(&missed, "missed", "skip", "ticks missed while the shard had no leader: skip, or once")
	add.MarkFlagsMutuallyExclusive("cron", "every")

	list := &cobra.Command{
		Use:   "list [PREFIX]",
		Short: "List schedules",
		Long: `schedule list prints the schedules whose queues start with PREFIX (all without
one), by queue and name: timing, next and last tick, and how many ticks
inserted a task.

With -o json it prints a SchedulesResponse.`,
		Example: `  taskctl schedule list
  taskctl schedule list reports/`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Schedules(ctx, &taskstorepb.SchedulesRequest{Prefix: prefix})
				if err != nil {
					return apiError("schedule list", "", err)
				}
				if a.output == "json" {
					return printJSON(a.stdout, resp)
				}
				return printSchedules(a.stdout, resp.Schedules)
			})
		},
	}

	var removeQueue string
	remove := &cobra.Command{
		Use:   "remove NAME [--queue QUEUE]",
		Short: "Remove a schedule",
		Long: `schedule remove deletes the schedule NAME; the tasks it inserted stay. Names
are unique within a consistency group: when schedules of several groups have
NAME, give --queue (a queue of the group) to say which.`,
		Example: `  taskctl schedule remove nightly-report`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				deleted, err := c.DeleteSchedule(ctx, args[0], removeQueue)
				if err != nil {
					return apiError("schedule remove", "", err)
				}
				if a.output == "json" {
					return printJSON(a.stdout, &taskstorepb.DeleteScheduleResponse{Deleted: deleted})
				}
				if !deleted {
					fmt.Fprintf(a.stdout, "no schedule %s in that group\n", args[0])
					return nil
				}
				fmt.Fprintf(a.stdout, "schedule %s removed\n", args[0])
				return nil
			})
		},
	}
	remove.Flags().StringVar(&removeQueue, "queue", "", "a queue of the schedule's consistency group")

	cmd.AddCommand(add, list, remove)
	return cmd
}

func printSchedules(w io.Writer, ss []*taskstorepb.Schedule) error {
	t := newTable(w, "NAME", "QUEUE", "SHARD", "TIMING", "NEXT", "LAST", "FIRED", "MISSED")
	for _, s := range ss {
		timing := "every " + formatDuration(s.Every)
		if s.Cron != "" {
			timing = s.Cron
			if s.TimeZone != "" {
				timing += " (" + s.TimeZone + ")"
			}
		}
		missed := "skip"
		if s.Missed == taskstorepb.MissedTicks_MISSED_TICKS_RUN_ONCE {
			missed = "once"
		}
		t.row(s.Name, s.Queue, u64(uint64(s.Shard)), timing, formatTime(s.Next), formatTime(s.Last), u64(s.Fired), missed)
	}
	return t.flush()
}
