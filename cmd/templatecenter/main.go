// Command templatecenter is CubeTemplateCenter: with no arguments it serves
// the build API CubeMaster calls; its subcommands inspect the spool and build
// or inspect template images without an agent.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

// Revision is the VCS commit, set at build time with -ldflags
// "-X main.Revision=..."; when unset, revision reads the one the go
// command stamped into the binary.
var Revision = ""

// revision returns the commit the binary was built from, "" when unknown.
func revision() string {
	if Revision != "" {
		return Revision
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return ""
}

// errUsage marks a command-line mistake: exit code 2.
var errUsage = errors.New("usage")

const usage = `Usage: templatecenter [COMMAND] [ARGS]

CubeTemplateCenter turns OCI images into ext4 template root filesystems for
Cube Sandbox microVMs.

Commands:
  serve              run the agent (the default when no command is given);
                     --strict-config makes unknown configuration keys fatal
  jobs [list]        list jobs in the spool (read-only; safe while the agent runs)
  jobs show JOB_ID   show one job and its pending reports
  jobs cancel JOB_ID cancel a queued or running job (asks the running agent)
  build --image REF  build a template image without an agent
  inspect IMG [PATH] list a directory (default /) or print a file of a template
                     image, without mounting it; --check runs the start check
  check-config       check the configuration as serve would read it: every
                     setting with its source (secrets redacted), warnings;
                     exit 1 when invalid
  version            print the version, revision and Go version
  help               print this help

Every command takes -h or --help for its flags. The agent reads its
configuration from the YAML file named by CUBE_TEMPLATE_CENTER_CONFIG_PATH
(built-in defaults when unset); jobs also finds an installed
/etc/cube-templatecenter. See templatecenter(8).
`

func main() {
	os.Exit(exitCode(Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr), os.Stderr))
}

func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errInvalidConfig):
		return 1 // check-config printed the errors
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, err)
		return 2
	default:
		fmt.Fprintln(stderr, "templatecenter:", err)
		return 1
	}
}

// stdio are a command's standard streams.
type stdio struct {
	in          io.Reader
	out, errOut io.Writer
}

// commandFunc runs one command with the arguments after its name.
type commandFunc func(ctx context.Context, args []string, std stdio) error

// commands maps each command name (and alias) to its function; a new
// command is one entry here and one line in usage.
func commands() map[string]commandFunc {
	help := func(_ context.Context, _ []string, std stdio) error {
		fmt.Fprint(std.out, usage)
		return nil
	}
	m := map[string]commandFunc{
		"serve": serveCommand,
		"jobs": func(ctx context.Context, args []string, std stdio) error {
			return jobs(ctx, args, std.out, std.errOut)
		},
		"build": func(ctx context.Context, args []string, std stdio) error {
			return build(ctx, args, std.in, std.out, std.errOut)
		},
		"inspect": func(ctx context.Context, args []string, std stdio) error {
			return inspectImage(ctx, args, std.out)
		},
		"check-config": func(_ context.Context, args []string, std stdio) error {
			return checkConfig(args, std.out, std.errOut)
		},
		"version": versionCommand,
		"help":    help,
	}
	for _, alias := range []string{"--version", "-version", "-v"} {
		m[alias] = versionCommand
	}
	for _, alias := range []string{"--help", "-help", "-h"} {
		m[alias] = help
	}
	return m
}

// Run executes one command line.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	name := "serve"
	if len(args) > 0 {
		name, args = args[0], args[1:]
	}
	run, ok := commands()[name]
	if !ok {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("%w: unknown command %q", errUsage, name)
	}
	return run(ctx, args, stdio{in: stdin, out: stdout, errOut: stderr})
}

var serveCmd = command{name: "serve", synopsis: []string{"[serve] [--strict-config]"}, about: `
Run the agent: serve the build API CubeMaster calls, build template images
and report each job back. Under systemd the socket unit starts it. It takes
no arguments: the configuration comes from the file named by
CUBE_TEMPLATE_CENTER_CONFIG_PATH and from the environment (see
templatecenter(8) and the README). SIGHUP reloads it; SIGTERM stops
gracefully.`}

// serveCommand reads serve's flags and runs the agent.
func serveCommand(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet(serveCmd)
	strict := fs.Bool("strict-config", false, "make unknown configuration keys fatal (also config.strict: true or "+config.StrictEnv+"=true)")
	operands, err := parseArgs(fs, serveCmd, args, std.out)
	if err != nil {
		return err
	}
	if len(operands) != 0 {
		return usageError(serveCmd, "takes no arguments (configure with "+config.PathEnv+")")
	}
	return serve(ctx, config.Options{Strict: *strict}, std.errOut)
}

var versionCmd = command{name: "version", synopsis: []string{"version [--json]"}, about: `
Print the version, the VCS revision it was built from and the Go version
(and, with --json, whether cgo, which the agent's SQLite spool needs, was
on).`}

// versionInfo is what `templatecenter version --json` prints.
type versionInfo struct {
	Version   string `json:"version"`
	Revision  string `json:"revision"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
	Cgo       bool   `json:"cgo"`
}

func versionCommand(_ context.Context, args []string, std stdio) error {
	fs := newFlagSet(versionCmd)
	asJSON := fs.Bool("json", false, "print JSON")
	operands, err := parseArgs(fs, versionCmd, args, std.out)
	if err != nil {
		return err
	}
	if len(operands) != 0 {
		return usageError(versionCmd, "takes no arguments")
	}
	v := versionInfo{Version: Version, Revision: revision(), GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, Cgo: cgoEnabled}
	if *asJSON {
		enc := json.NewEncoder(std.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	rev := v.Revision
	if rev == "" {
		rev = "unknown"
	}
	fmt.Fprintf(std.out, "templatecenter %s\nrevision: %s\ngo: %s %s\n", v.Version, rev, v.GoVersion, v.Platform)
	if !v.Cgo {
		fmt.Fprintln(std.out, "cgo: off (the agent and jobs cannot open the SQLite spool; build and inspect work)")
	}
	return nil
}
