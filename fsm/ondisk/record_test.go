package ondisk

import (
	"bytes"
	"math"
	"reflect"
	"testing"
)

func TestTaskRecordRoundTrips(t *testing.T) {
	for _, tk := range []*Task{
		{},
		{Queue: 7, Version: 3, At: -5, Priority: -2, Value: []byte("v"), Created: 1, Modified: 2, Claims: 1, Attempt: 4, Claimant: "w", Key: "k", Err: "boom"},
		{Queue: math.MaxUint32, Version: math.MaxUint64, At: math.MinInt64, Priority: math.MinInt32, Created: math.MaxInt64, Modified: math.MinInt64, Claims: math.MaxUint32, Attempt: math.MaxUint32},
		{Priority: math.MaxInt32, At: math.MaxInt64},
	} {
		b := AppendTask(nil, tk)
		got, err := DecodeTask(b)
		if err != nil {
			t.Fatalf("decode %+v: %v", tk, err)
		}
		if got.Value == nil && tk.Value != nil {
			got.Value = []byte{}
		}
		if !reflect.DeepEqual(got, tk) && !(len(got.Value) == 0 && len(tk.Value) == 0 && eqButValue(got, tk)) {
			t.Errorf("round trip: got %+v, want %+v", got, tk)
		}
		if again := AppendTask(nil, got); !bytes.Equal(again, b) {
			t.Errorf("re-encoding differs: %x vs %x", again, b)
		}
	}
}

func eqButValue(a, b *Task) bool {
	x, y := *a, *b
	x.Value, y.Value = nil, nil
	return reflect.DeepEqual(x, y)
}

// FuzzDecodeTask: any bytes decode to an error or to a task whose encoding
// decodes to the same task; never a panic.
func FuzzDecodeTask(f *testing.F) {
	f.Add(AppendTask(nil, &Task{Queue: 1, Version: 2, At: 3, Value: []byte("x"), Claimant: "c"}))
	f.Add([]byte{0x08, 0xff})
	f.Add([]byte{0x0a, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := DecodeTask(data)
		if err != nil {
			return
		}
		again, err := DecodeTask(AppendTask(nil, tk))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !eqButValue(again, tk) || !bytes.Equal(again.Value, tk.Value) {
			t.Fatalf("round trip changed the task: %+v vs %+v", again, tk)
		}
	})
}
