package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"text/tabwriter"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/inspect"
)

var inspectCmd = command{name: "inspect", synopsis: []string{"inspect [--json] IMAGE.ext4 [PATH]"}, about: `
List a directory (default /) of a template image, or print a file, without
mounting it: no root needed. With --json a directory is a JSON array of its
entries and anything else one entry (its metadata, not its content).`}

// entryJSON is one entry of `inspect --json`.
type entryJSON struct {
	Name       string    `json:"name"`
	Type       string    `json:"type"`
	Mode       string    `json:"mode"`
	Perm       string    `json:"perm"`
	UID        uint32    `json:"uid"`
	GID        uint32    `json:"gid"`
	Size       int64     `json:"size"`
	ModTime    time.Time `json:"mtime"`
	Nlink      uint16    `json:"nlink"`
	Inode      uint32    `json:"inode"`
	LinkTarget string    `json:"link_target,omitempty"`
	Major      *uint32   `json:"major,omitempty"`
	Minor      *uint32   `json:"minor,omitempty"`
}

func toJSON(e inspect.Entry) entryJSON {
	j := entryJSON{Name: e.Name, Type: fileType(e.Mode), Mode: e.Mode.String(), Perm: unixPerm(e.Mode),
		UID: e.UID, GID: e.GID, Size: e.Size, ModTime: e.ModTime.UTC(), Nlink: e.Nlink, Inode: e.Inode, LinkTarget: e.LinkTarget}
	if e.Mode&fs.ModeDevice != 0 {
		j.Major, j.Minor = &e.Major, &e.Minor
	}
	return j
}

// unixPerm is mode's permission bits as chmod takes them, in octal.
func unixPerm(m fs.FileMode) string {
	p := uint32(m.Perm())
	for bit, v := range map[fs.FileMode]uint32{fs.ModeSetuid: 0o4000, fs.ModeSetgid: 0o2000, fs.ModeSticky: 0o1000} {
		if m&bit != 0 {
			p |= v
		}
	}
	return fmt.Sprintf("%04o", p)
}

// fileType names the type of mode as find -type would spell it out.
func fileType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "dir"
	case m.IsRegular():
		return "file"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeCharDevice != 0:
		return "char"
	case m&fs.ModeDevice != 0:
		return "block"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	case m&fs.ModeSocket != 0:
		return "socket"
	default:
		return "other"
	}
}

// inspectImage lists a directory of a template image, or prints a file,
// without mounting it.
func inspectImage(_ context.Context, args []string, stdout io.Writer) error {
	flags := newFlagSet(inspectCmd)
	asJSON := flags.Bool("json", false, "print JSON: a directory's entries, or one entry's metadata")
	operands, err := parseArgs(flags, inspectCmd, args, stdout)
	if err != nil {
		return err
	}
	if len(operands) < 1 || len(operands) > 2 {
		return usageError(inspectCmd, "want IMAGE.ext4 and at most one PATH, got %d arguments", len(operands))
	}
	p := "/"
	if len(operands) == 2 {
		p = operands[1]
	}
	im, err := inspect.Open(operands[0])
	if err != nil {
		return err
	}
	defer im.Close()
	e, err := im.Stat(p)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if !e.Mode.IsDir() {
			return enc.Encode(toJSON(e))
		}
		entries, err := im.List(p)
		if err != nil {
			return err
		}
		out := make([]entryJSON, 0, len(entries))
		for _, e := range entries {
			out = append(out, toJSON(e))
		}
		return enc.Encode(out)
	}
	switch {
	case e.Mode.IsDir():
		entries, err := im.List(p)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 1, ' ', tabwriter.AlignRight)
		for _, e := range entries {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t %s\n", e.Mode, e.UID, e.GID, e.Size, e.ModTime.UTC().Format("2006-01-02 15:04"), describe(e))
		}
		return tw.Flush()
	case e.Mode.IsRegular():
		data, err := im.ReadFile(p)
		if err != nil {
			return err
		}
		_, err = stdout.Write(data)
		return err
	default:
		fmt.Fprintf(stdout, "%s %d:%d %s\n", e.Mode, e.UID, e.GID, describe(e))
		return nil
	}
}

func describe(e inspect.Entry) string {
	switch {
	case e.Mode&fs.ModeSymlink != 0:
		return e.Name + " -> " + e.LinkTarget
	case e.Mode&fs.ModeDevice != 0:
		return fmt.Sprintf("%s (%d, %d)", e.Name, e.Major, e.Minor)
	default:
		return e.Name
	}
}
