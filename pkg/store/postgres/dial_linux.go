package postgres

import "golang.org/x/sys/unix"

// setTCPUserTimeout sets TCP_USER_TIMEOUT on the socket fd to ms milliseconds.
func setTCPUserTimeout(fd uintptr, ms int) error {
	return unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, ms)
}
