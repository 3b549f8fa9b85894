package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent"
	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

var (
	jobsCmd = command{name: "jobs", synopsis: []string{
		"jobs [list] [--state STATE] [--limit N] [--json] [--spool PATH | --config FILE]",
		"jobs show JOB_ID [--json] [--spool PATH | --config FILE]",
		"jobs cancel JOB_ID [--addr URL] [--timeout D] [--config FILE] [--env-file FILE]"},
		about: `
List the jobs of the spool, newest first, or show one (jobs show -h), or
cancel one (jobs cancel -h). The spool is opened read-only: this is safe
while the agent runs. Its path comes from --spool, else from the
configuration: CUBE_TEMPLATE_CENTER_CONFIG_PATH and the environment, else
the installed /etc/cube-templatecenter/conf.yaml and templatecenter.env
when readable.`}
	jobsShowCmd = command{name: "jobs show", synopsis: []string{"jobs show JOB_ID [--json] [--spool PATH | --config FILE]"}, about: `
Show one job of the spool and its pending status reports (read-only; safe
while the agent runs).`}
	jobsCancelCmd = command{name: "jobs cancel", synopsis: []string{"jobs cancel JOB_ID [--addr URL] [--timeout D] [--config FILE] [--env-file FILE]"}, about: `
Cancel a queued or running job: the running agent is asked, on its
configured address with the shared token (CUBE_TEMPLATE_CALLBACK_TOKEN or
its _FILE), from the environment, else from the installed
/etc/cube-templatecenter/templatecenter.env and conf.yaml when readable
(root). The job ends FAILED "cancelled".`}
)

// jobStates are the states jobs --state accepts.
var jobStates = []spool.State{spool.StateQueued, spool.StateRunning, spool.StateBuilt, spool.StateFailed}

// configFlags are the flags that say where a CLI command finds the
// agent's configuration.
type configFlags struct{ config, envFile *string }

func addConfigFlags(fs *flag.FlagSet, withEnvFile bool) configFlags {
	cf := configFlags{config: fs.String("config", "", "the agent's configuration file (default: $"+config.PathEnv+
		", else "+defaultSysconfDir+"/"+installedConfig+" when readable)")}
	if withEnvFile {
		cf.envFile = fs.String("env-file", "", "the service's environment file, read after the environment (default: "+
			defaultSysconfDir+"/"+installedEnvFile+" when readable)")
	} else {
		cf.envFile = new(string)
	}
	return cf
}

// load reads the configuration as the installed service would (see
// installedEnv), printing to stderr what it could not read.
func (cf configFlags) load(stderr io.Writer) (*config.Config, error) {
	env, notes, err := installedEnv(os.LookupEnv, *cf.config, *cf.envFile)
	if err != nil {
		return nil, err
	}
	for _, n := range notes {
		fmt.Fprintln(stderr, "templatecenter: note:", n)
	}
	cfg, err := config.Load(env, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, fmt.Errorf("load configuration: %w", err)
	}
	return cfg, nil
}

// jobs lists or shows jobs from the spool, opened read-only, or asks the
// running agent to cancel one.
func jobs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "cancel":
			return jobsCancel(ctx, args[1:], stdout, stderr)
		case "show":
			return jobsShow(ctx, args[1:], stdout, stderr)
		case "list":
			args = args[1:]
		}
	}
	fs := newFlagSet(jobsCmd)
	spoolPath := fs.String("spool", "", "spool database (default: spool.path of the configuration)")
	cf := addConfigFlags(fs, false)
	state := fs.String("state", "", "only jobs in this state: queued, running, built or failed")
	limit := fs.Int("limit", 50, "at most this many jobs, newest first (0: all)")
	asJSON := fs.Bool("json", false, "print a JSON array of jobs")
	operands, err := parseArgs(fs, jobsCmd, args, stdout)
	if err != nil {
		return err
	}
	if len(operands) != 0 {
		return usageError(jobsCmd, "jobs list takes no arguments, got %q", operands)
	}
	if *state != "" && !slices.Contains(jobStates, spool.State(*state)) {
		return usageError(jobsCmd, "--state %q: want one of queued, running, built, failed", *state)
	}
	if *limit < 0 {
		return usageError(jobsCmd, "--limit %d: want 0 (all) or more", *limit)
	}
	sp, err := openSpool(ctx, *spoolPath, cf, stderr)
	if err != nil {
		return err
	}
	defer sp.Close()
	list, err := sp.Jobs(ctx, spool.JobFilter{State: spool.State(*state), Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		views := make([]any, 0, len(list))
		for _, j := range list {
			views = append(views, agent.View(j))
		}
		return json.NewEncoder(stdout).Encode(views)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB ID\tSTATE\tPHASE\tPROGRESS\tATTEMPTS\tARTIFACT\tUPDATED\tERROR")
	for _, j := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", j.ID, j.State, j.Phase, j.Progress, j.Attempts,
			j.ArtifactID, j.UpdatedAt.Format(time.RFC3339), safetext.Line(j.Error, 60))
	}
	return tw.Flush()
}

// openSpool opens the spool at path, or else at the configuration's
// spool.path, read-only.
func openSpool(ctx context.Context, path string, cf configFlags, stderr io.Writer) (*spool.Spool, error) {
	if path == "" {
		cfg, err := cf.load(stderr)
		if err != nil {
			return nil, err
		}
		path = cfg.Spool.Path
	}
	return spool.OpenReadOnly(ctx, path)
}

// jobsShow prints one job and its pending reports.
func jobsShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(jobsShowCmd)
	spoolPath := fs.String("spool", "", "spool database (default: spool.path of the configuration)")
	cf := addConfigFlags(fs, false)
	asJSON := fs.Bool("json", false, "print JSON: {\"job\": ..., \"pending_reports\": [...]}")
	operands, err := parseArgs(fs, jobsShowCmd, args, stdout)
	if err != nil {
		return err
	}
	if len(operands) != 1 {
		return usageError(jobsShowCmd, "want one JOB_ID, got %d arguments", len(operands))
	}
	sp, err := openSpool(ctx, *spoolPath, cf, stderr)
	if err != nil {
		return err
	}
	defer sp.Close()
	j, err := sp.Job(ctx, operands[0])
	if err != nil {
		return err
	}
	reports, err := sp.Reports(ctx, j.ID)
	if err != nil {
		return err
	}
	if *asJSON {
		pending := make([]map[string]any, 0, len(reports))
		for _, r := range reports {
			pending = append(pending, map[string]any{"kind": r.Kind, "terminal": r.Terminal, "attempts": r.Attempts,
				"next_attempt": r.NextAttempt, "last_error": r.LastError, "body": json.RawMessage(r.Body)})
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"job": agent.View(j), "pending_reports": pending})
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.Format(time.RFC3339)
	}
	row("job", j.ID)
	row("state", string(j.State))
	row("phase", j.Phase)
	row("progress", strconv.Itoa(j.Progress)+"%")
	row("attempts", strconv.Itoa(j.Attempts))
	row("artifact", j.ArtifactID)
	row("fingerprint", j.Fingerprint)
	row("created", stamp(j.CreatedAt))
	row("started", stamp(j.StartedAt))
	row("finished", stamp(j.FinishedAt))
	row("updated", stamp(j.UpdatedAt))
	row("error", j.Error)
	row("pending reports", strconv.Itoa(len(reports)))
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range reports {
		kind := r.Kind
		if r.Terminal {
			kind += " (terminal)"
		}
		fmt.Fprintf(stdout, "  %s: %d attempts, next %s", kind, r.Attempts, stamp(r.NextAttempt))
		if r.LastError != "" {
			fmt.Fprintf(stdout, ", last error: %s", safetext.Line(r.LastError, 200))
		}
		fmt.Fprintln(stdout)
	}
	return nil
}

// jobsCancel asks the running agent to cancel a job. The agent owns the
// spool and the builds, so this goes through its API, on the address and
// with the shared token of the agent's own configuration and environment.
func jobsCancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(jobsCancelCmd)
	addr := fs.String("addr", "", "the agent's base URL (default: http:// common.http_bind:common.http_port, on the loopback when it binds all addresses)")
	timeout := fs.Duration("timeout", 30*time.Second, "give up waiting for the agent's answer after this")
	cf := addConfigFlags(fs, true)
	operands, err := parseArgs(fs, jobsCancelCmd, args, stdout)
	if err != nil {
		return err
	}
	if len(operands) != 1 {
		return usageError(jobsCancelCmd, "want one JOB_ID, got %d arguments", len(operands))
	}
	if *timeout <= 0 {
		return usageError(jobsCancelCmd, "--timeout %s: want a positive duration", *timeout)
	}
	if *addr != "" {
		if u, err := url.Parse(*addr); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usageError(jobsCancelCmd, "--addr %q: want a URL such as http://127.0.0.1:8080", *addr)
		}
	}
	jobID := operands[0]
	cfg, err := cf.load(stderr)
	if err != nil {
		return err
	}
	base := strings.TrimRight(*addr, "/")
	if base == "" {
		base = "http://" + localAddr(cfg)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tc/api/v1/jobs/"+url.PathEscape(jobID)+"/cancel", nil)
	if err != nil {
		return fmt.Errorf("cancel job %s: %w", jobID, err)
	}
	if cfg.Master.Token != "" {
		req.Header.Set(api.TokenHeader, cfg.Master.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("cancel job %s: the agent is not running at %s (connection refused); it must run to cancel a job (or pass --addr)", jobID, base)
	}
	if err != nil {
		return fmt.Errorf("cancel job %s: ask the agent at %s: %w", jobID, base, err)
	}
	defer resp.Body.Close()
	var answer struct {
		Error string `json:"error"`
		State string `json:"state"`
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = json.Unmarshal(raw, &answer)
	switch resp.StatusCode {
	case http.StatusOK:
		fmt.Fprintf(stdout, "job %s cancelled\n", jobID)
		return nil
	case http.StatusConflict:
		return fmt.Errorf("cancel job %s: it already finished (%s); nothing to cancel", jobID, answer.State)
	case http.StatusNotFound:
		return fmt.Errorf("cancel job %s: the agent at %s has no such job", jobID, base)
	case http.StatusUnauthorized, http.StatusServiceUnavailable:
		why := "no token was sent"
		switch {
		case resp.StatusCode == http.StatusServiceUnavailable:
			why = "the agent has no token configured"
		case cfg.Master.Token != "":
			why = "the token sent is not the agent's"
		}
		return fmt.Errorf("cancel job %s: the agent at %s refused: %s (%s; the token comes from %s or %s%s, in the "+
			"environment or %s/%s, as for the agent)", jobID, base, answer.Error, why, api.TokenEnv, api.TokenEnv,
			config.FileSuffix, defaultSysconfDir, installedEnvFile)
	default:
		msg := answer.Error
		if msg == "" {
			msg = strings.TrimSpace(string(raw))
		}
		return fmt.Errorf("cancel job %s: the agent at %s answered %s: %s", jobID, base, resp.Status, msg)
	}
}

// localAddr is the agent's listening address as a local client reaches it:
// an all-addresses bind is reached on the loopback.
func localAddr(cfg *config.Config) string {
	host := cfg.Common.HTTPBind
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::", "[::]":
		host = "::1"
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(cfg.Common.HTTPPort))
}
