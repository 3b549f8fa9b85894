package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/inspect"
)

var inspectCmd = command{name: "inspect", synopsis: []string{"inspect [--json] IMAGE.ext4 [PATH]",
	"inspect --check [--image-config FILE] [--command CMD] [--env KEY=VALUE]... [--user USER] [--workdir DIR] [--arch ARCH] IMAGE.ext4"}, about: `
List a directory (default /) of a template image, or print a file, without
mounting it: no root needed. With --json a directory is a JSON array of its
entries and anything else one entry (its metadata, not its content).

With --check, run the start check a build runs on the image's tree: can
the start command run in it? The command is the image config's (--image-config,
the JSON of a BUILT report's image_config_json or of build's image_config)
with the overrides of the flags, as a template's container_overrides
apply; an image has no command of its own. The result is printed as JSON;
exit 1 when the command certainly cannot run.`}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// checkFlags are the flags of inspect --check.
type checkFlags struct {
	check                *bool
	imageConfig, command *string
	user, workdir, arch  *string
	env                  stringList
}

// names lists the flags only --check takes.
var checkOnlyFlags = []string{"image-config", "command", "env", "user", "workdir", "arch"}

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
	cf := checkFlags{
		check:       flags.Bool("check", false, "run the start check on the image and print its result"),
		imageConfig: flags.String("image-config", "", "with --check: file holding the image config JSON (Entrypoint, Cmd, Env, WorkingDir, User)"),
		command:     flags.String("command", "", `with --check: the command, replacing the image's Entrypoint and Cmd: words split at spaces, or a JSON array ("[\"sh\",\"-c\",\"x y\"]")`),
		user:        flags.String("user", "", "with --check: the user the command runs as (name, uid, name:group, uid:gid)"),
		workdir:     flags.String("workdir", "", "with --check: the working directory"),
		arch:        flags.String("arch", runtime.GOARCH, "with --check: the image's architecture (GOARCH: amd64, arm64, ...)"),
	}
	flags.Var(&cf.env, "env", "with --check: KEY=VALUE on top of the image's environment (repeatable)")
	operands, err := parseArgs(flags, inspectCmd, args, stdout)
	if err != nil {
		return err
	}
	if *cf.check {
		if *asJSON {
			return usageError(inspectCmd, "--check prints JSON already; drop --json")
		}
		if len(operands) != 1 {
			return usageError(inspectCmd, "--check takes IMAGE.ext4 alone, got %d arguments", len(operands))
		}
		return checkImage(operands[0], cf, stdout)
	}
	for _, name := range checkOnlyFlags {
		if isSet(flags, name) {
			return usageError(inspectCmd, "--%s goes with --check", name)
		}
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

// checkImage runs the start check on the image at imagePath and prints
// its result; a failing check is an error after it.
func checkImage(imagePath string, cf checkFlags, stdout io.Writer) error {
	var cfg rootfs.ImageConfig
	if *cf.imageConfig != "" {
		data, err := os.ReadFile(*cf.imageConfig)
		if err != nil {
			return fmt.Errorf("read image config: %w", err)
		}
		if err := json.Unmarshal(data, &cfg); err != nil {
			return fmt.Errorf("image config %s: %w", *cf.imageConfig, err)
		}
	}
	var o rootfs.StartOverrides
	if *cf.command != "" {
		cmd, err := parseCommand(*cf.command)
		if err != nil {
			return usageError(inspectCmd, "--command: %v", err)
		}
		o.Command = cmd
	}
	for _, kv := range cf.env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return usageError(inspectCmd, "--env %q is not KEY=VALUE", kv)
		}
	}
	o.Env = cf.env
	o.WorkingDir = *cf.workdir
	if *cf.user != "" {
		// As the image's User: every form it takes, name:group included.
		cfg.User = *cf.user
	}
	if *cf.arch == "" {
		return usageError(inspectCmd, "--arch must not be empty")
	}
	res, err := rootfs.CheckImage(imagePath, cfg, *cf.arch, o)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(res); err != nil {
		return err
	}
	if res.Failed() {
		return &rootfs.StartCheckError{Result: res}
	}
	return nil
}

// parseCommand reads --command: a JSON array of strings, or words split at
// white space.
func parseCommand(s string) ([]string, error) {
	if strings.HasPrefix(strings.TrimSpace(s), "[") {
		var argv []string
		if err := json.Unmarshal([]byte(s), &argv); err != nil {
			return nil, fmt.Errorf("not a JSON array of strings: %w", err)
		}
		if len(argv) == 0 {
			return nil, errors.New("empty command")
		}
		return argv, nil
	}
	argv := strings.Fields(s)
	if len(argv) == 0 {
		return nil, errors.New("empty command")
	}
	return argv, nil
}
