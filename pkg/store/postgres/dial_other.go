//go:build !linux

package postgres

// setTCPUserTimeout does nothing where TCP_USER_TIMEOUT does not exist: a write sent into a
// partition is retransmitted as long as the kernel's defaults say.
func setTCPUserTimeout(uintptr, int) error { return nil }
