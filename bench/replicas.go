package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
)

// replicaPoll is the agents' replicas.lock_poll_interval in the replica
// rows: the default, so the bound measured is the one operators get.
const replicaPoll = 5 * time.Second

// ReplicaResult is the two-replica rows: two agents on one machine sharing
// one MariaDB database and one fs blob store.
type ReplicaResult struct {
	// Spread is two distinct images submitted together, one to each agent.
	SpreadImages [2]string     `json:"spread_images"`
	SpreadWall   time.Duration `json:"spread_wall_ns"`
	// SpreadSolo is the larger of the two images' median solo cold builds
	// from the main run (0 when not measured).
	SpreadSolo time.Duration `json:"spread_solo_ns"`
	// Same is one spec submitted to both agents at once.
	SameImage string `json:"same_image"`
	// Winner and Waiter are each agent's submit-to-BUILT time; the waiter
	// is the later one.
	Winner time.Duration `json:"winner_ns"`
	Waiter time.Duration `json:"waiter_ns"`
	// Builds counts the image builds the two agents ran for the spec.
	Builds int `json:"builds"`
	// Poll is the agents' lock poll interval.
	Poll time.Duration `json:"poll_ns"`
}

// replicaPair is two agents configured as replicas of one deployment.
type replicaPair struct {
	master *cubemaster.Server
	agents [2]*agentProc
}

// measureReplicas runs the two-replica rows on fresh agents (cold caches):
// the first two images spread over two agents, then the first image sent
// to both of two other agents.
func (h *harness) measureReplicas(ctx context.Context) error {
	if len(h.cfg.Images) < 2 {
		return fmt.Errorf("bench: the replica rows need two images, got %v", h.cfg.Images)
	}
	h.logf("replicas: starting MariaDB")
	mdb, err := dbserver.NewMariaDB(ctx)
	if err != nil {
		return fmt.Errorf("bench: replicas: %w", err)
	}
	defer mdb.Close()
	db, err := sql.Open("mysql", mdb.DSN())
	if err != nil {
		return fmt.Errorf("bench: replicas: %w", err)
	}
	defer db.Close()
	if err := dbserver.CreateCubeMasterSchema(ctx, db, dbserver.MySQLDialect); err != nil {
		return fmt.Errorf("bench: replicas: %w", err)
	}
	res := &ReplicaResult{SpreadImages: [2]string{h.cfg.Images[0], h.cfg.Images[1]}, SameImage: h.cfg.Images[0], Poll: replicaPoll}
	dir := filepath.Join(h.cfg.WorkDir, "builds", "replicas")

	spread, err := h.startReplicas(ctx, db, mdb, filepath.Join(dir, "spread"))
	if err != nil {
		return err
	}
	walls, err := spread.buildTogether(ctx, []string{"replica-spread-0", "replica-spread-1"},
		[]string{h.refs[res.SpreadImages[0]], h.refs[res.SpreadImages[1]]})
	spread.stop()
	if err != nil {
		return err
	}
	res.SpreadWall = slices.Max(walls)
	for _, name := range res.SpreadImages {
		res.SpreadSolo = max(res.SpreadSolo, h.medianWall(name, PipelineCold))
	}

	same, err := h.startReplicas(ctx, db, mdb, filepath.Join(dir, "same"))
	if err != nil {
		return err
	}
	defer same.stop()
	ref := h.refs[res.SameImage]
	walls, err = same.buildTogether(ctx, []string{"replica-same-0", "replica-same-1"}, []string{ref, ref})
	if err != nil {
		return err
	}
	res.Winner, res.Waiter = slices.Min(walls), slices.Max(walls)
	for _, a := range same.agents {
		n, err := a.metric(ctx, `cube_templatecenter_build_phase_duration_seconds_count{phase="build"}`)
		if err != nil && !errors.Is(err, errNotExported) {
			return fmt.Errorf("bench: replicas: %w", err)
		}
		res.Builds += int(n)
	}
	h.report.Replicas = res
	h.logf("replicas: spread %s (solo %s), same spec winner %s waiter %s, %d build(s)",
		res.SpreadWall, res.SpreadSolo, res.Winner, res.Waiter, res.Builds)
	return nil
}

// startReplicas starts a CubeMaster stand-in keeping db and two agents on
// db and one fs blob store under dir.
func (h *harness) startReplicas(ctx context.Context, db *sql.DB, mdb *dbserver.MySQL, dir string) (*replicaPair, error) {
	master, err := cubemaster.Start(benchToken)
	if err != nil {
		return nil, fmt.Errorf("bench: replicas: %w", err)
	}
	if err := master.UseDatabase(db, "mysql"); err != nil {
		master.Stop()
		return nil, fmt.Errorf("bench: replicas: %w", err)
	}
	p := &replicaPair{master: master}
	extra := fmt.Sprintf(`artifact_store:
  backend: fs
  fs_root: %s
  record_secret: secret shared by the benchmark replicas
instance_db_config:
  driver: mysql
  addr: %s
  user: %s
  pwd: %s
  db_name: %s
replicas:
  lock_poll_interval: %s
`, filepath.Join(dir, "blobs"), mdb.Addr, mdb.User, mdb.Password, mdb.DBName, replicaPoll)
	setup := h.setup
	setup.Master, setup.ExtraYAML = master, extra
	for i := range p.agents {
		a, err := startAgent(ctx, setup, filepath.Join(dir, fmt.Sprintf("agent-%d", i)))
		if err != nil {
			p.stop()
			return nil, err
		}
		p.agents[i] = a
	}
	return p, nil
}

// buildTogether creates a job row for each job and submits job i with ref
// i to agent i at the same moment; it returns each submit-to-BUILT time.
func (p *replicaPair) buildTogether(ctx context.Context, jobIDs, refs []string) ([]time.Duration, error) {
	type outcome struct {
		i    int
		wall time.Duration
		err  error
	}
	msgs := make([]map[string]any, len(jobIDs))
	for i, id := range jobIDs {
		msgs[i] = buildMessage(p.master, id, refs[i], nil)
		req, err := json.Marshal(msgs[i]["request"])
		if err == nil {
			err = p.master.CreateJob(ctx, id, req)
		}
		if err != nil {
			return nil, fmt.Errorf("bench: replicas: create job %s: %w", id, err)
		}
	}
	done := make(chan outcome, len(jobIDs))
	for i := range jobIDs {
		go func() {
			a := p.agents[i]
			began, err := a.submitMessage(ctx, msgs[i])
			if err != nil {
				done <- outcome{i: i, err: err}
				return
			}
			b, err := a.wait(ctx, p.master, jobIDs[i], began)
			if err != nil {
				done <- outcome{i: i, err: err}
				return
			}
			done <- outcome{i: i, wall: b.Wall}
		}()
	}
	walls := make([]time.Duration, len(jobIDs))
	for range jobIDs {
		o := <-done
		if o.err != nil {
			return nil, fmt.Errorf("bench: replicas: %w", o.err)
		}
		walls[o.i] = o.wall
	}
	return walls, nil
}

func (p *replicaPair) stop() {
	for _, a := range p.agents {
		if a != nil {
			a.Stop()
		}
	}
	p.master.Stop()
}

// medianWall is the median wall time of pipeline on image in the main run.
func (h *harness) medianWall(image, pipeline string) time.Duration {
	var walls []float64
	for _, m := range h.report.Measurements {
		if m.Image == image && m.Pipeline == pipeline {
			walls = append(walls, m.Wall.Seconds())
		}
	}
	if len(walls) == 0 {
		return 0
	}
	return time.Duration(median(walls) * float64(time.Second))
}

// write prints the replica rows and their targets.
func (r *ReplicaResult) write(w io.Writer) {
	fmt.Fprintln(w, "two replicas (one MariaDB, one fs blob store, lock poll", r.Poll.String()+"):")
	fmt.Fprintln(w, "| case | images | wall s | reference s |")
	fmt.Fprintln(w, "|---|---|---:|---:|")
	fmt.Fprintf(w, "| spread: one image per replica, together | %s + %s | %.3f | %.3f (slower solo cold) |\n",
		r.SpreadImages[0], r.SpreadImages[1], r.SpreadWall.Seconds(), r.SpreadSolo.Seconds())
	fmt.Fprintf(w, "| same spec to both: winner | %s | %.3f | - |\n", r.SameImage, r.Winner.Seconds())
	fmt.Fprintf(w, "| same spec to both: waiter | %s | %.3f | %.3f (winner + poll) |\n", r.SameImage, r.Waiter.Seconds(),
		(r.Winner + r.Poll).Seconds())
	verdict := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "MISS"
	}
	fmt.Fprintf(w, "  %s  %-48s want %-36s got %s\n", verdict(r.Waiter-r.Winner <= r.Poll),
		"replicas: waiter's BUILT after the winner's", "<= "+r.Poll.String(), (r.Waiter - r.Winner).Round(time.Millisecond).String())
	fmt.Fprintf(w, "  %s  %-48s want %-36s got %d\n", verdict(r.Builds == 1), "replicas: builds of the shared spec", "1", r.Builds)
}
