package policy

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// classesServedCondition: False (ClassStarving) when, on some shard that answered, a class (the
// non-urgent rows of one cadence and source) has had due rows and no render for longer than its
// cadence at the shard's asOf (shardapi.Class.Starving), naming the class that has waited the most
// cadences, its shard and since when it waits (to the second, so the message stays the same while
// the wait goes on). Unknown when no shard answered; True otherwise, also for shards too old to
// report waitingSince.
func classesServedCondition(reports []ShardReport) Condition {
	type starving struct {
		shard, class string
		since        time.Time
		cadence      time.Duration
		cadences     float64
	}
	var worst *starving
	n, asked := 0, 0
	for _, rep := range reports {
		st := rep.Status
		if st == nil {
			continue
		}
		asked++
		for _, c := range st.Classes {
			if !c.Starving(st.AsOf) {
				continue
			}
			n++
			s := starving{shard: rep.Name, class: fmt.Sprintf("%s/%s", formatLag(c.CadenceDuration()), c.Source),
				since: c.WaitingSince.UTC().Truncate(time.Second), cadence: c.CadenceDuration(),
				cadences: c.Waiting(st.AsOf).Seconds() / c.Cadence}
			if worst == nil || s.cadences > worst.cadences {
				worst = &s
			}
		}
	}
	switch {
	case worst != nil:
		more := ""
		if n > 1 {
			more = fmt.Sprintf(" (and %d more starving %s)", n-1, plural(n-1, "class", "classes"))
		}
		return Condition{metav1.ConditionFalse, rqv1.ReasonClassStarving, fmt.Sprintf(
			"class %s on shard %s has had due rows and no render since %s, longer than its cadence (%s)%s",
			worst.class, worst.shard, worst.since.Format(time.RFC3339), formatLag(worst.cadence), more)}
	case asked == 0:
		return Condition{metav1.ConditionUnknown, rqv1.ReasonNoShardReports, "no shard could be asked"}
	default:
		return Condition{metav1.ConditionTrue, rqv1.ReasonAllClassesServed, fmt.Sprintf(
			"no class has gone longer than its cadence without a render on the %d %s that answered", asked, plural(asked, "shard", "shards"))}
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
