// Command templatecenter is CubeTemplateCenter: with no arguments it serves
// the build API CubeMaster calls; its subcommands inspect the spool and build
// or inspect template images without an agent.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
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
  build --image REF  build a template image without an agent (see build -h)
  inspect IMG [PATH] list a directory (default /) or print a file of a template
                     image, without mounting it
  check-config       check the configuration as serve would read it: every
                     setting with its source (secrets redacted), warnings;
                     exit 1 when invalid (see check-config -h)
  version            print the version

The agent reads its configuration from the YAML file named by
CUBE_TEMPLATE_CENTER_CONFIG_PATH (built-in defaults when unset); see the
README for keys and environment overrides.
`

func main() {
	os.Exit(exitCode(Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr), os.Stderr))
}

func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil:
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

// Run executes one command line.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, stderr)
	case "jobs":
		return jobs(ctx, args, stdout)
	case "check-config":
		return checkConfig(args, stdout, stderr)
	case "build":
		return build(ctx, args, stdin, stdout, stderr)
	case "inspect":
		return inspectImage(ctx, args, stdout)
	case "version", "--version", "-version", "-v":
		fmt.Fprintln(stdout, "templatecenter", Version)
		return nil
	case "help", "--help", "-help", "-h":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
	}
}
