package oci

import (
	"encoding/binary"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// noNetlink is set once the kernel refused a netlink socket, as it does
// under a unit whose RestrictAddressFamilies= leaves AF_NETLINK out: later
// checks go to probeLocal at once.
var noNetlink atomic.Bool

// routeSeq numbers the route lookups.
var routeSeq atomic.Uint32

// routeLocal asks the kernel for its route to a, as `ip route get` does,
// and reports whether the route is of type local: the kernel delivers a
// connection to a to this host. That covers every address of every
// interface and the local routes of whole ranges (AnyIP). ok is false when
// netlink cannot be used.
func routeLocal(a netip.Addr) (local, ok bool) {
	if noNetlink.Load() {
		return false, false
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		noNetlink.Store(true)
		return false, false
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(time.Second.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return false, false
	}
	family := byte(unix.AF_INET)
	if a.Is6() {
		family = unix.AF_INET6
	}
	dst := a.AsSlice()
	attrLen := unix.SizeofRtAttr + len(dst) // 8 or 20: aligned
	msg := make([]byte, unix.SizeofNlMsghdr+unix.SizeofRtMsg+attrLen)
	seq := routeSeq.Add(1)
	ne := binary.NativeEndian
	// struct nlmsghdr: len, type, flags, seq, pid (0: the kernel).
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], unix.RTM_GETROUTE)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(msg[8:], seq)
	// struct rtmsg: family, dst_len, then zeroes.
	rt := msg[unix.SizeofNlMsghdr:]
	rt[0], rt[1] = family, byte(8*len(dst))
	// struct rtattr RTA_DST and the address.
	at := rt[unix.SizeofRtMsg:]
	ne.PutUint16(at[0:], uint16(attrLen))
	ne.PutUint16(at[2:], unix.RTA_DST)
	copy(at[unix.SizeofRtAttr:], dst)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, false
	}
	buf := make([]byte, 8192)
	for {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return false, false
		}
		if sa, isNl := from.(*unix.SockaddrNetlink); !isNl || sa.Pid != 0 {
			continue // not from the kernel
		}
		for b := buf[:n]; len(b) >= unix.SizeofNlMsghdr; {
			l := int(ne.Uint32(b[0:]))
			if l < unix.SizeofNlMsghdr || l > len(b) {
				return false, false
			}
			typ, mseq := ne.Uint16(b[4:]), ne.Uint32(b[8:])
			body := b[unix.SizeofNlMsghdr:l]
			b = b[min((l+3)&^3, len(b)):]
			if mseq != seq {
				continue
			}
			switch typ {
			case unix.NLMSG_ERROR:
				// No route (unreachable, prohibited, blackhole): no
				// connection gets there either, to this host or any.
				return false, true
			case unix.RTM_NEWROUTE:
				if len(body) < unix.SizeofRtMsg {
					return false, false
				}
				return body[7] == unix.RTN_LOCAL, true // rtmsg.rtm_type
			}
		}
	}
}
