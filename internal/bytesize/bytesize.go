// Package bytesize prints byte counts for people, the one way every
// command and message of the repository prints them.
package bytesize

import "fmt"

// Format prints n in the largest binary unit (KiB, MiB, GiB, TiB) that
// keeps it at least 1, with one decimal: "512 B", "1.5 KiB", "2.0 GiB".
func Format(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, suffix := float64(n), ""
	for _, s := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v /= unit
		suffix = s
		if v < unit {
			break
		}
	}
	return fmt.Sprintf("%.1f %s", v, suffix)
}
