// Package textfmt holds the number formatting shared by the programs that print figures for
// people (the status view, the web console, the simulator's report).
package textfmt

import (
	"strconv"
	"strings"
)

// Thousands formats an integer with thousands separators: 1234567 → "1,234,567", -1234 → "-1,234".
func Thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
