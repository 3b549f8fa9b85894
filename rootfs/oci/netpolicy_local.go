package oci

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// hostAddress reports whether the kernel delivers a connection to a to
// this host: loopback, and any address of any interface (the node's own
// eth0 address reaches every service bound to 0.0.0.0). The kernel's
// route lookup answers (routeLocal); where netlink is refused, probeLocal.
func hostAddress(a netip.Addr) (bool, error) {
	a = a.Unmap().WithZone("")
	if local, ok := routeLocal(a); ok {
		return local, nil
	}
	return probeLocal(a)
}

// probeLocal connects a UDP socket to a, which sends nothing, and reads
// the source address the kernel chose: for an address of this host the
// kernel's local route picks that address itself. It needs no netlink,
// only the AF_INET/AF_INET6 sockets every registry connection needs. A
// local route for a whole range with another preferred source (AnyIP with
// src) escapes it; routeLocal does not.
func probeLocal(a netip.Addr) (bool, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 9)))
	if err != nil {
		for _, noRoute := range []error{syscall.ENETUNREACH, syscall.EHOSTUNREACH, syscall.EACCES,
			syscall.EINVAL, syscall.EADDRNOTAVAIL, syscall.EAFNOSUPPORT} {
			if errors.Is(err, noRoute) {
				return false, nil // no connection gets there either
			}
		}
		return false, err
	}
	defer c.Close()
	la, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok {
		return false, fmt.Errorf("probe %s: local address %v", a, c.LocalAddr())
	}
	return la.AddrPort().Addr().Unmap() == a, nil
}
