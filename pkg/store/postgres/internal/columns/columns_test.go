package columns

import (
	"fmt"
	"strings"
	"testing"
)

// TestStringsKeepTheirBytes decodes strings of many sizes through one Strings, reusing the
// source buffer as a decoder does, and checks each string is still its bytes after later ones
// filled and replaced blocks.
func TestStringsKeepTheirBytes(t *testing.T) {
	var s Strings
	buf := make([]byte, 0, 2*stringsBlock)
	var want, got []string
	for i := range 5000 {
		size := []int{0, 1, 63, 64, 65, 200, stringsBlock / 8, stringsBlock/8 + 1, stringsBlock}[i%9]
		buf = buf[:0]
		for j := range size {
			buf = append(buf, byte('a'+(i+j)%26))
		}
		want = append(want, string(buf))
		got = append(got, s.Get(buf))
		clear(buf) // the decoder's buffer is reused: the strings must not share it
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("string %d (%d bytes) changed: %.20q…, want %.20q…", i, len(want[i]), got[i], want[i])
		}
	}
}

// TestStringsAllocateByBlock checks that short strings cost an allocation per block, not per
// string.
func TestStringsAllocateByBlock(t *testing.T) {
	key := []byte(fmt.Sprintf("https://shop.example.com/product/%031d", 7))
	var s Strings
	const per = 1000 // 64 kB of 64-byte keys: one block
	allocs := testing.AllocsPerRun(20, func() {
		for range per {
			if s.Get(key) != string(key) {
				t.Fatal("Get changed the bytes")
			}
		}
	})
	if allocs > 2 {
		t.Errorf("%v allocations per %d keys, want at most 2", allocs, per)
	}
	if got := s.Get(nil); got != "" {
		t.Errorf("Get(nil) = %q", got)
	}
	if long := strings.Repeat("x", stringsBlock); s.Get([]byte(long)) != long {
		t.Error("a string longer than a block changed")
	}
}
