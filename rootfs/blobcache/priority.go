package blobcache

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// onBackgroundThread runs fn on an OS thread of its own at the lowest CPU
// priority (nice 19) and in the idle I/O class, then lets the thread end so
// the priorities never reach other goroutines. Failing to lower a priority
// (a seccomp filter, say) is harmless: fn runs anyway.
func onBackgroundThread(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Never unlocked: the thread exits with the goroutine.
		runtime.LockOSThread()
		tid := unix.Gettid()
		_ = unix.Setpriority(unix.PRIO_PROCESS, tid, 19)
		const ioprioWhoProcess, ioprioClassIdle, ioprioClassShift = 1, 3, 13
		_, _, _ = unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(tid), ioprioClassIdle<<ioprioClassShift)
		fn()
	}()
	<-done
}
