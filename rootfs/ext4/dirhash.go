package ext4

import (
	"encoding/binary"
	"math/bits"
)

// Directory hash version recorded in the superblock and in htree roots. The
// superblock also sets the "unsigned hash" flag, so the effective algorithm
// is half_md4 over unsigned bytes on every architecture.
const (
	hashHalfMD4      = 1
	flagUnsignedHash = 0x2
)

// hashSeedWords turns Options.HashSeed into the four little-endian words the
// kernel reads from s_hash_seed. An all-zero seed selects the default.
func hashSeedWords(seed [16]byte) [4]uint32 {
	var w [4]uint32
	nonzero := false
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(seed[4*i:])
		if w[i] != 0 {
			nonzero = true
		}
	}
	if !nonzero {
		return [4]uint32{0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476}
	}
	return w
}

// str2hashbuf packs up to 4*num bytes of msg into num words, padded with a
// length-derived pattern (unsigned-char variant).
func str2hashbuf(msg []byte, num int, out []uint32) {
	pad := uint32(len(msg)) | uint32(len(msg))<<8
	pad |= pad << 16
	val := pad
	n := len(msg)
	if n > num*4 {
		n = num * 4
	}
	o := 0
	for i := 0; i < n; i++ {
		val = uint32(msg[i]) + val<<8
		if i%4 == 3 {
			out[o] = val
			o++
			val = pad
			num--
		}
	}
	num--
	if num >= 0 {
		out[o] = val
		o++
	}
	for num--; num >= 0; num-- {
		out[o] = pad
		o++
	}
}

func halfMD4Transform(buf *[4]uint32, in []uint32) {
	const (
		k2 = 0o13240474631
		k3 = 0o15666365641
	)
	a, b, c, d := buf[0], buf[1], buf[2], buf[3]
	f := func(x, y, z uint32) uint32 { return z ^ (x & (y ^ z)) }
	g := func(x, y, z uint32) uint32 { return (x & y) + ((x ^ y) & z) }
	h := func(x, y, z uint32) uint32 { return x ^ y ^ z }
	r := bits.RotateLeft32

	a = r(a+f(b, c, d)+in[0], 3)
	d = r(d+f(a, b, c)+in[1], 7)
	c = r(c+f(d, a, b)+in[2], 11)
	b = r(b+f(c, d, a)+in[3], 19)
	a = r(a+f(b, c, d)+in[4], 3)
	d = r(d+f(a, b, c)+in[5], 7)
	c = r(c+f(d, a, b)+in[6], 11)
	b = r(b+f(c, d, a)+in[7], 19)

	a = r(a+g(b, c, d)+in[1]+k2, 3)
	d = r(d+g(a, b, c)+in[3]+k2, 5)
	c = r(c+g(d, a, b)+in[5]+k2, 9)
	b = r(b+g(c, d, a)+in[7]+k2, 13)
	a = r(a+g(b, c, d)+in[0]+k2, 3)
	d = r(d+g(a, b, c)+in[2]+k2, 5)
	c = r(c+g(d, a, b)+in[4]+k2, 9)
	b = r(b+g(c, d, a)+in[6]+k2, 13)

	a = r(a+h(b, c, d)+in[3]+k3, 3)
	d = r(d+h(a, b, c)+in[7]+k3, 9)
	c = r(c+h(d, a, b)+in[2]+k3, 11)
	b = r(b+h(c, d, a)+in[6]+k3, 15)
	a = r(a+h(b, c, d)+in[1]+k3, 3)
	d = r(d+h(a, b, c)+in[5]+k3, 9)
	c = r(c+h(d, a, b)+in[0]+k3, 11)
	b = r(b+h(c, d, a)+in[4]+k3, 15)

	buf[0] += a
	buf[1] += b
	buf[2] += c
	buf[3] += d
}

// dirHash returns the htree major hash (low bit clear) of name.
func dirHash(name []byte, seed [4]uint32) uint32 {
	buf := seed
	var in [8]uint32
	p := name
	for n := len(p); ; {
		str2hashbuf(p, 8, in[:])
		halfMD4Transform(&buf, in[:])
		if n <= 32 {
			break
		}
		n -= 32
		p = p[32:]
	}
	h := buf[1] &^ 1
	if h == 0x7fffffff<<1 {
		h = (0x7fffffff - 1) << 1
	}
	return h
}
