package bench

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procSample is what /proc tells about a process at one moment.
type procSample struct {
	// PeakRSS is VmHWM in bytes: the resident set's high-water mark since
	// the process started or since resetPeak; RSS is VmRSS, the resident
	// set now.
	PeakRSS int64
	RSS     int64
	// WriteBytes is write_bytes of /proc/PID/io: bytes the process caused
	// to be sent to storage (counted when pages are dirtied).
	WriteBytes int64
	// CancelledBytes is cancelled_write_bytes: dirty bytes the process
	// truncated or deleted before writeback, so they never reached the disk.
	CancelledBytes int64
	// CPU is the user plus system time of all the process's threads.
	CPU time.Duration
}

// sampleProc reads VmHWM and write_bytes of pid.
func sampleProc(pid int) (procSample, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procSample{}, fmt.Errorf("read process status: %w", err)
	}
	hwm, err := parseStatusKB(string(status), "VmHWM")
	if err != nil {
		return procSample{}, err
	}
	rss, err := parseStatusKB(string(status), "VmRSS")
	if err != nil {
		return procSample{}, err
	}
	io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return procSample{}, fmt.Errorf("read process io: %w", err)
	}
	wb, err := parseIOField(string(io), "write_bytes")
	if err != nil {
		return procSample{}, err
	}
	cancelled, err := parseIOField(string(io), "cancelled_write_bytes")
	if err != nil {
		return procSample{}, err
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procSample{}, fmt.Errorf("read process stat: %w", err)
	}
	cpu, err := parseStatCPU(string(stat))
	if err != nil {
		return procSample{}, err
	}
	return procSample{PeakRSS: hwm, RSS: rss, WriteBytes: wb, CancelledBytes: cancelled, CPU: cpu}, nil
}

// userHZ is the unit of the times in /proc/PID/stat (USER_HZ, 100 on every
// Linux architecture Go supports).
const userHZ = 100

// parseStatCPU returns utime + stime of a /proc/PID/stat line. The command
// name (field 2) is in parentheses and may hold spaces, so fields are
// counted after the last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse stat: %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("parse stat: %d fields after the command", len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse stat: utime %q stime %q", f[11], f[12])
	}
	return time.Duration(utime+stime) * time.Second / userHZ, nil
}

// selfCPU returns the user plus system time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// resetPeak resets pid's VmHWM to its current RSS (clear_refs 5, Linux
// 4.0+), so the next sample's peak covers only what follows.
func resetPeak(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("reset peak RSS: %w", err)
	}
	return nil
}

// parseStatusKB returns the "key:   N kB" line of /proc/PID/status in
// bytes.
func parseStatusKB(status, key string) (int64, error) {
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("parse %s: unexpected value %q", key, v)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s: %w", key, err)
		}
		return n << 10, nil
	}
	return 0, fmt.Errorf("parse status: no %s line", key)
}

// parseIOField returns the "key: N" line of /proc/PID/io.
func parseIOField(io, key string) (int64, error) {
	sc := bufio.NewScanner(strings.NewReader(io))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s: %w", key, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("parse io: no %s line", key)
}

// loadAvg1 returns the one-minute load average (0 when unreadable).
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	l, _ := parseLoadAvg(string(b))
	return l[0]
}

// parseLoadAvg parses the first three fields of /proc/loadavg.
func parseLoadAvg(s string) ([3]float64, error) {
	var out [3]float64
	f := strings.Fields(s)
	if len(f) < 3 {
		return out, fmt.Errorf("parse loadavg: %q", s)
	}
	for i := range out {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return out, fmt.Errorf("parse loadavg: %w", err)
		}
		out[i] = v
	}
	return out, nil
}

// childUsage is what a finished child used.
type childUsage struct {
	Wall time.Duration
	// MaxRSS is ru_maxrss in bytes: the largest resident set of the child
	// or of any descendant it reaped.
	MaxRSS int64
	// WriteBytes is ru_oublock × 512.
	WriteBytes int64
	// CPU is user plus system time.
	CPU time.Duration
}

// timeFormat is the GNU time format runTool asks for: peak RSS (KiB),
// file system outputs (512-byte units, which Linux counts from the same
// write_bytes as /proc/PID/io), user and system seconds.
const timeFormat = "%M %O %U %S"

// parseTimeUsage parses the last line of GNU time's timeFormat output
// (earlier lines may say the command failed).
func parseTimeUsage(s string) (childUsage, error) {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) != 4 {
		return childUsage{}, fmt.Errorf("parse time output %q", s)
	}
	kib, err1 := strconv.ParseInt(f[0], 10, 64)
	blocks, err2 := strconv.ParseInt(f[1], 10, 64)
	user, err3 := strconv.ParseFloat(f[2], 64)
	sys, err4 := strconv.ParseFloat(f[3], 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return childUsage{}, fmt.Errorf("parse time output %q", s)
	}
	return childUsage{MaxRSS: kib << 10, WriteBytes: blocks * 512,
		CPU: time.Duration((user + sys) * float64(time.Second))}, nil
}

// fileSize returns the apparent size and the allocated bytes of path.
func fileSize(path string) (apparent, allocated int64, err error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Size, st.Blocks * 512, nil
}

// owner is a file's numeric owner.
type owner struct{ uid, gid int }

// statOwner returns the owner recorded in fi.
func statOwner(fi os.FileInfo) (owner, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return owner{}, false
	}
	return owner{int(st.Uid), int(st.Gid)}, true
}
