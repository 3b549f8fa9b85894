package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// errHelp marks a help request (-h, --help) that has been answered on
// standard output: exit code 0.
var errHelp = errors.New("help shown")

// command describes one subcommand's command line for its help: the
// synopsis lines after "Usage:" and a paragraph on what it does.
type command struct {
	name     string
	synopsis []string
	about    string
}

// newFlagSet returns an empty flag set for cmd whose errors and help the
// caller prints (parseArgs), never the flag package itself.
func newFlagSet(cmd command) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseArgs parses flags anywhere among args (before, between or after the
// operands, as GNU tools do; "--" ends the flags) and returns the operands.
// -h and --help print cmd's help with its flags to stdout and return
// errHelp; an unknown flag or a bad value is a usage error.
func parseArgs(fs *flag.FlagSet, cmd command, args []string, stdout io.Writer) ([]string, error) {
	var operands []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			printHelp(stdout, fs, cmd)
			return nil, errHelp
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v (see templatecenter %s -h)", errUsage, cmd.name, err, cmd.name)
		}
		rest := fs.Args()
		if consumed := args[:len(args)-len(rest)]; len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			return append(operands, rest...), nil
		}
		if len(rest) == 0 {
			return operands, nil
		}
		operands = append(operands, rest[0])
		args = rest[1:]
	}
}

// printHelp writes cmd's synopsis, description and flags.
func printHelp(w io.Writer, fs *flag.FlagSet, cmd command) {
	for i, s := range cmd.synopsis {
		prefix := "Usage: "
		if i > 0 {
			prefix = "       "
		}
		fmt.Fprintf(w, "%stemplatecenter %s\n", prefix, s)
	}
	if cmd.about != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(cmd.about))
	}
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		fmt.Fprintln(w, "\nFlags: none besides -h, --help.")
		return
	}
	fmt.Fprintln(w, "\nFlags (one or two dashes):")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	fmt.Fprintln(w, "  -h, --help\n    \tshow this help")
}

// usageError is a usage error for cmd naming its synopsis.
func usageError(cmd command, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s\nUsage: templatecenter %s", errUsage, cmd.name, fmt.Sprintf(format, args...),
		strings.Join(cmd.synopsis, "\n       templatecenter "))
}
