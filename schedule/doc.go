// Package schedule reads the timing of periodic schedules: a cron expression in a time zone, or a fixed interval, and the ticks
// they give. Only a shard's leader evaluates them: it writes each tick it
// computes into the log (fsmpb.Fire), so replicas never read a clock or a
// time zone database. The zone database is compiled in (time/tzdata) as a
// fallback: the container images (FROM scratch) have none and use it; a
// node with a system zoneinfo (or $ZONEINFO) reads that first. Nodes whose
// zone data differ may compute a cron tick differently when they lead, but
// each tick is in the log, so replicas still agree on what fired.
package schedule
