package keeper

import "time"

// DefaultVerifyWalkRate is the default Settings.VerifyWalkRate of the keeper command and of a
// RenderQueue (its spec.verifyWalkRate, rqv1.DefaultVerifyWalkRate): a shard of 10M rows verifies
// them in 100 s, against a default verify interval of an hour.
const DefaultVerifyWalkRate = 100_000

// walkPacer keeps a verification walk to at most rate rows a second, in pauses between the
// walk's steps, so that a shard re-reading millions of rows leaves the CPUs (its own and
// PostgreSQL's) to claims and completions, and spreads its reads over time instead of reading as
// fast as PostgreSQL can send. Only a walk that verifies is paced (Shard.verifying): the load,
// a walk that repairs a gap or a partial walk, and one that prepares incoming slots run as fast
// as they can, since the shard vouches for less until they end. A walk that stops verifying
// midway (a gap opened, slots arrived) stops pausing at once.
type walkPacer struct {
	rate  int // rows a second; 0: never pause
	on    bool
	since time.Time // when the paced stretch began
	rows  int       // rows walked in it
}

// step accounts n rows walked by now and returns how long to pause before the next step: the
// time the stretch's rows should have taken at rate, less the time they took. paced false (the
// walk does not verify) ends the stretch and returns 0; a later paced step begins a new one. A
// stretch more than maxPaceLag behind its rate begins again.
func (p *walkPacer) step(paced bool, n int, now time.Time) time.Duration {
	if !paced || p.rate <= 0 {
		p.on = false
		return 0
	}
	if !p.on {
		p.on, p.since, p.rows = true, now, 0
		return 0 // the first step's rows were read before the stretch began
	}
	p.rows += n
	d := time.Duration(float64(p.rows)/float64(p.rate)*float64(time.Second)) - now.Sub(p.since)
	if d < -maxPaceLag {
		// behind the rate (PostgreSQL was slow): begin again rather than catch up in a burst
		p.since, p.rows = now, 0
		return 0
	}
	return max(0, d)
}

// maxPaceLag is how far behind its rate a paced walk may fall before its stretch begins again:
// the most it may then read in a burst to catch up.
const maxPaceLag = 100 * time.Millisecond
