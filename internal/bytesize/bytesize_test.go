package bytesize

import "testing"

func TestFormat(t *testing.T) {
	for n, want := range map[uint64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
		128 << 10: "128.0 KiB", 320 << 20: "320.0 MiB", 2 << 30: "2.0 GiB", 3 << 40: "3.0 TiB", 5000 << 40: "5000.0 TiB",
	} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}
