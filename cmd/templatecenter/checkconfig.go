package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
)

// errInvalidConfig marks a configuration check that found errors: exit 1,
// with the errors already printed.
var errInvalidConfig = errors.New("configuration is invalid")

// checkConfigResult is check-config's --json output.
type checkConfigResult struct {
	// Path is the file read, "" when none (defaults and environment).
	Path     string           `json:"path"`
	Valid    bool             `json:"valid"`
	Errors   []string         `json:"errors"`
	Warnings []string         `json:"warnings"`
	Settings []config.Setting `json:"settings,omitempty"`
}

// checkConfig reads the configuration exactly as serve does (config.Read,
// the same environment) and prints the effective settings with their
// sources, secrets redacted, then the warnings; an invalid configuration
// is exit code 1. The unit runs it before a start and a reload, so a bad
// file fails those visibly and never reaches the running agent.
var checkConfigCmd = command{name: "check-config", synopsis: []string{"check-config [--json] [-q] [--strict-config]"}, about: `
Read the configuration as serve would (the file named by
CUBE_TEMPLATE_CENTER_CONFIG_PATH and the environment), print every setting
with its source, secrets redacted, and the warnings. Exit status: 0 valid,
1 invalid, 2 usage.`}

func checkConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(checkConfigCmd)
	jsonOut := fs.Bool("json", false, "print the result as JSON")
	quiet := fs.Bool("q", false, "print only errors (for ExecStartPre= and ExecReload=: the agent logs the warnings itself)")
	strict := fs.Bool("strict-config", false, "make unknown keys fatal, as serve --strict-config does")
	operands, err := parseArgs(fs, checkConfigCmd, args, stdout)
	if err != nil {
		return err
	}
	if len(operands) > 0 {
		return usageError(checkConfigCmd, "takes no arguments (the file is named by "+config.PathEnv+")")
	}
	cfg, report, err := config.Read(os.LookupEnv, config.Options{Strict: *strict})
	res := checkConfigResult{Path: report.Path, Valid: err == nil, Errors: []string{}, Warnings: []string{}}
	for _, w := range report.Warnings {
		res.Warnings = append(res.Warnings, w.Text)
	}
	if err != nil {
		res.Errors = strings.Split(err.Error(), "\n")
	} else {
		res.Settings = report.Settings(cfg)
	}
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if werr := enc.Encode(res); werr != nil {
			return werr
		}
	} else {
		printCheck(stdout, stderr, res, *quiet)
	}
	if !res.Valid {
		return errInvalidConfig
	}
	return nil
}

// printCheck writes the settings and the verdict to stdout, warnings and
// errors to stderr; quiet leaves only the errors, as the agent logs the
// warnings itself (the environment's once, at start).
func printCheck(stdout, stderr io.Writer, res checkConfigResult, quiet bool) {
	file := res.Path
	if file == "" {
		file = "none (" + config.PathEnv + " unset): built-in defaults and the environment"
	}
	if !quiet && res.Valid {
		fmt.Fprintf(stdout, "# configuration file: %s\n", file)
		for _, s := range res.Settings {
			fmt.Fprintf(stdout, "%s = %s  # %s\n", s.Key, s.Value, s.Source)
		}
	}
	for _, w := range res.Warnings {
		if !quiet {
			fmt.Fprintf(stderr, "warning: %s\n", w)
		}
	}
	for _, e := range res.Errors {
		fmt.Fprintf(stderr, "error: %s\n", e)
	}
	switch {
	case !res.Valid:
		fmt.Fprintf(stderr, "configuration %s is invalid: %d error(s)\n", file, len(res.Errors))
	case !quiet:
		fmt.Fprintf(stdout, "configuration OK (%d warning(s))\n", len(res.Warnings))
	}
}
