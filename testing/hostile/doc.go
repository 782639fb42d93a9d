// Package hostile replays, against real taskstored and taskproxy processes
// of a secured cluster, every hostile call that once got
// through: a scoped token reaching a task outside its prefixes, the --http
// port serving values and profiles to anyone, an anonymous proxy in front
// of a secured cluster, small requests asking for huge answers, huge HTTP
// bodies, and malformed input at the edges. Each case states what an
// attacker sends and what must come back; docs/security.md has the model.
package hostile
