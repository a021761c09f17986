package wire

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// trickyStrings are keys, routes, leases and errors that exercise every escaping rule.
var trickyStrings = []string{
	"", "plain", "https://shop.example.com/product/0000000000000000000000000000042",
	"a<b>&c", "\u2028\u2029", "x\u2028y\u2029z", "\x00\x01\x1f\x7f", `"\/`, "\b\f\n\r\t",
	"héllo", "日本語", "😀", "\ufffd", "\xff", "a\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "é\xe9",
	"<script>alert(1)</script>", strings.Repeat("k", 2048),
}

// trickyTimes include ones json.Marshal refuses (years outside 0-9999, offsets of 24 h or more).
var trickyTimes = []time.Time{
	{},
	time.Date(2024, 2, 29, 23, 59, 59, 0, time.UTC),
	time.Date(2024, 2, 29, 23, 59, 59, 123456789, time.UTC),
	time.Date(2024, 2, 29, 23, 59, 59, 120000000, time.FixedZone("", 5*3600+30*60)),
	time.Date(2099, 12, 31, 23, 59, 59, 999_999_999, time.FixedZone("", -(11*3600+30*60))),
	time.Date(2024, 6, 1, 12, 0, 0, 1, time.Local),
	time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
	time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
	time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
	time.Date(2024, 1, 1, 0, 0, 0, 0, time.FixedZone("", 24*3600)),
	time.Date(2024, 1, 1, 0, 0, 0, 0, time.FixedZone("odd", 61)),
	time.Now(), // with a monotonic reading
}

// trickyFloats include ones json.Marshal refuses (NaN, infinities).
var trickyFloats = []float64{
	0, math.Copysign(0, -1), 1, -1, 3600, 345600, 0.5, 1e-6, 9.99e-7, 1e-7, 1e20, 1e21, 123456789.123,
	math.MaxFloat64, math.SmallestNonzeroFloat64, -1e-300, math.NaN(), math.Inf(1), math.Inf(-1),
}

// sameAsMarshal fails the test unless got (with err) is what json.Marshal(v) gives.
func sameAsMarshal(t *testing.T, what string, v any, got []byte, err error) {
	t.Helper()
	want, werr := json.Marshal(v)
	switch {
	case werr != nil && err == nil:
		t.Errorf("%s: json.Marshal fails (%v), the fast encoder wrote %s", what, werr, got)
	case werr == nil && err != nil:
		t.Errorf("%s: the fast encoder fails (%v), json.Marshal wrote %s", what, err, want)
	case werr == nil && !bytes.Equal(got, want):
		t.Errorf("%s:\n got %s\nwant %s", what, got, want)
	}
}

// checkAppend encodes every hot message built from the arguments with the fast encoders (after
// a prefix, which they must keep) and compares each with json.Marshal.
func checkAppend(t *testing.T, s1, s2 string, tm time.Time, f float64, urgent bool, n int) {
	t.Helper()
	prefix := []byte("prefix")
	withPrefix := func(b []byte, err error) ([]byte, error) {
		if !bytes.HasPrefix(b, prefix) {
			t.Fatalf("the prefix is lost: %q", b)
		}
		if err != nil && len(b) != len(prefix) {
			t.Errorf("on error the fast encoder returned %q, not dst as it was", b)
		}
		return b[len(prefix):], err
	}
	var claim shardapi.ClaimResponse
	var complete shardapi.CompleteRequest
	var release shardapi.ReleaseRequest
	var cres shardapi.CompleteResponse
	var rres shardapi.ReleaseResponse
	if n >= 0 {
		claim.Items = []shardapi.ClaimedRow{}
		complete.Items = []shardapi.Completion{}
		release.Items = []shardapi.Lease{}
		cres.Results = []shardapi.ItemResult{}
		rres.Results = []shardapi.ItemResult{}
	}
	for i := range n {
		claim.Items = append(claim.Items, shardapi.ClaimedRow{Key: s1, Due: tm, Cadence: f, Route: s2, Source: s1 + s2,
			Urgent: urgent, Lease: s2, LeaseExpires: tm.Add(time.Duration(i) * time.Second)})
		c := shardapi.Completion{Key: s1, Lease: s2}
		if i%2 == 1 {
			c.NextDue = &tm
		}
		complete.Items = append(complete.Items, c)
		release.Items = append(release.Items, shardapi.Lease{Key: s1, Lease: s2})
		cres.Results = append(cres.Results, shardapi.ItemResult{Key: s1, Error: []string{"", s2}[i%2], MovedTo: []string{"", "", s1}[i%3]})
		rres.Results = append(rres.Results, shardapi.ItemResult{Key: s2, Error: []string{s1, ""}[i%2]})
	}
	cres.Completed, rres.Released = n*int(f), -n

	b, err := withPrefix(AppendClaimResponse(prefix, &claim))
	sameAsMarshal(t, "claim reply", claim, b, err)
	b, err = withPrefix(AppendCompleteRequest(prefix, &complete))
	sameAsMarshal(t, "complete request", complete, b, err)
	b, err = withPrefix(AppendReleaseRequest(prefix, &release), nil)
	sameAsMarshal(t, "release request", release, b, err)
	b, err = withPrefix(AppendCompleteResponse(prefix, &cres), nil)
	sameAsMarshal(t, "complete reply", cres, b, err)
	b, err = withPrefix(AppendReleaseResponse(prefix, &rres), nil)
	sameAsMarshal(t, "release reply", rres, b, err)
}

// TestAppendMatchesMarshal: every tricky string, time and number encodes as json.Marshal
// encodes it, and fails where it fails; nil and empty lists too.
func TestAppendMatchesMarshal(t *testing.T) {
	for _, n := range []int{-1, 0, 1, 3} {
		for _, s := range trickyStrings {
			checkAppend(t, s, "0123456789abcdef", trickyTimes[1], 3600, true, n)
			checkAppend(t, "k", s, trickyTimes[2], 0.5, false, n)
		}
		for _, tm := range trickyTimes {
			checkAppend(t, "k", "l", tm, 1, false, n)
		}
		for _, f := range trickyFloats {
			checkAppend(t, "k", "l", trickyTimes[3], f, true, n)
		}
	}
}

// FuzzAppend compares the fast encoders with json.Marshal.
func FuzzAppend(f *testing.F) {
	for i, s := range trickyStrings {
		tm := trickyTimes[i%len(trickyTimes)]
		f.Add(s, trickyStrings[(i+1)%len(trickyStrings)], tm.Unix(), int64(tm.Nanosecond()), 3600*(i%5-2), trickyFloats[i%len(trickyFloats)], i%2 == 0)
	}
	f.Add("k", "l", int64(253402300800), int64(0), 0, 1.0, true) // year 10000
	f.Add("k", "l", int64(0), int64(1), 86400, 1e21, false)      // a 24 h offset
	f.Fuzz(func(t *testing.T, s1, s2 string, sec, nsec int64, offset int, cadence float64, urgent bool) {
		tm := time.Unix(sec, nsec).In(time.FixedZone("", offset))
		if offset == 0 {
			tm = tm.UTC()
		}
		checkAppend(t, s1, s2, tm, cadence, urgent, 2)
	})
}
