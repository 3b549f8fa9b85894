package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// jobs lists or shows jobs from the spool, opened read-only.
func jobs(ctx context.Context, args []string, stdout io.Writer) error {
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

func oneLine(s string, n int) string {
	for i, c := range s {
		if c == '\n' || i >= n {
			return s[:i] + "…"
		}
	}
	return s
}
