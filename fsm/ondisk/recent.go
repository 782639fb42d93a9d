package ondisk

// recentMax and recentBytes bound each recentSet: reaching either starts
// it over; a record over a sixteenth of recentBytes is not kept.
const (
	recentMax   = 4096
	recentBytes = 4 << 20
)

// recentSet holds committed records by key, within recentMax and
// recentBytes.
type recentSet[V any] struct {
	m     map[string]*V
	bytes int
}

// update brings the set up to date with the records a transaction read or
// wrote (nil: none there now). Dropping a record is always safe; keeping
// one that changed is not, so an old entry goes before anything else.
func (r *recentSet[V]) update(seen map[string]*V, size func(*V) int) {
	for k, v := range seen {
		if old, ok := r.m[k]; ok {
			r.bytes -= len(k) + size(old)
			delete(r.m, k)
		}
		if v == nil {
			continue
		}
		n := len(k) + size(v)
		if n > recentBytes/16 {
			continue
		}
		if len(r.m) >= recentMax || r.bytes+n > recentBytes {
			clear(r.m)
			r.bytes = 0
		}
		if r.m == nil {
			r.m = make(map[string]*V)
		}
		r.m[k] = v
		r.bytes += n
	}
}

// taskSize and sessionSize are what a record holds in memory, roughly.
func taskSize(tk *Task) int {
	return len(tk.Value) + len(tk.Key) + len(tk.Claimant) + len(tk.Err) + 128
}

func sessionSize(s *Session) int { return len(s.Result) + len(s.Group) + 64 }
