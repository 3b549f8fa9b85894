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
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent"
	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// jobs lists or shows jobs from the spool, opened read-only, or asks the
// running agent to cancel one.
func jobs(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "cancel" {
		return jobsCancel(ctx, args[1:], stdout)
	}
	fs := flag.NewFlagSet("jobs", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	spoolPath := fs.String("spool", "", "spool database (default: from the configuration)")
	state := fs.String("state", "", "only jobs in this state (queued, running, built, failed)")
	limit := fs.Int("limit", 50, "at most this many jobs, newest first")
	asJSON := fs.Bool("json", false, "print JSON")
	sub := "list"
	if len(args) > 0 && (args[0] == "list" || args[0] == "show") {
		sub, args = args[0], args[1:]
	}
	var jobID string
	if sub == "show" && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		jobID, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: jobs: %v", errUsage, err)
	}
	path := *spoolPath
	if path == "" {
		cfg, err := config.Load(os.LookupEnv, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			return fmt.Errorf("load configuration: %w", err)
		}
		path = cfg.Spool.Path
	}
	sp, err := spool.OpenReadOnly(ctx, path)
	if err != nil {
		return err
	}
	defer sp.Close()

	if sub == "show" {
		if jobID == "" && fs.NArg() == 1 {
			jobID = fs.Arg(0)
		} else if jobID == "" || fs.NArg() != 0 {
			return fmt.Errorf("%w: jobs show JOB_ID [-spool PATH]", errUsage)
		}
		j, err := sp.Job(ctx, jobID)
		if err != nil {
			return err
		}
		reports, err := sp.Reports(ctx, j.ID)
		if err != nil {
			return err
		}
		pending := make([]map[string]any, 0, len(reports))
		for _, r := range reports {
			pending = append(pending, map[string]any{"kind": r.Kind, "terminal": r.Terminal, "attempts": r.Attempts,
				"next_attempt": r.NextAttempt, "last_error": r.LastError, "body": json.RawMessage(r.Body)})
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"job": agent.View(j), "pending_reports": pending})
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: jobs list takes no arguments", errUsage)
	}
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
			j.ArtifactID, j.UpdatedAt.Format(time.RFC3339), oneLine(j.Error, 60))
	}
	return tw.Flush()
}

// jobsCancel asks the running agent to cancel a job. The agent owns the
// spool and the builds, so this goes through its API, on the address and
// with the shared token of the agent's own configuration and environment.
func jobsCancel(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("jobs cancel", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("addr", "", "the agent's base URL (default: http:// common.http_bind:common.http_port, on the loopback when it binds all addresses)")
	timeout := fs.Duration("timeout", 30*time.Second, "give up waiting for the agent's answer after this")
	var jobID string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		jobID, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: jobs cancel: %v", errUsage, err)
	}
	if jobID == "" && fs.NArg() == 1 {
		jobID = fs.Arg(0)
	} else if jobID == "" || fs.NArg() != 0 {
		return fmt.Errorf("%w: jobs cancel JOB_ID [-addr URL] [-timeout D]", errUsage)
	}
	cfg, err := config.Load(os.LookupEnv, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return fmt.Errorf("load configuration: %w", err)
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
		return fmt.Errorf("cancel job %s: the agent is not running at %s (connection refused); it must run to cancel a job (or pass -addr)", jobID, base)
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
		return fmt.Errorf("cancel job %s: the agent at %s refused: %s (the token comes from %s, as for the agent)",
			jobID, base, answer.Error, api.TokenEnv)
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

func oneLine(s string, n int) string {
	for i, c := range s {
		if c == '\n' || i >= n {
			return s[:i] + "…"
		}
	}
	return s
}
