package ext4

import (
	"errors"
	"os"
	"syscall"
)

const (
	fallocKeepSize  = 0x1
	fallocPunchHole = 0x2
)

// punchHole deallocates [off, off+n) of f, which then reads as zeros. It
// returns errPunchUnsupported where the filesystem cannot.
func punchHole(f *os.File, off, n int64) error {
	for {
		err := syscall.Fallocate(int(f.Fd()), fallocPunchHole|fallocKeepSize, off, n)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.ENOSYS):
			return errPunchUnsupported
		}
		return err
	}
}
