package main

// Helpers of the replica scenarios (replicas_test.go): agents that share
// CubeMaster's database (a real MariaDB or PostgreSQL of test/dbserver) and
// one S3 bucket, a CubeMaster stand-in in database mode, and a registry
// whose layer downloads can be held back to keep a build running.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/minio/minio-go/v7"

	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
)

// replicaWait bounds the waits of the replica scenarios: several agents,
// two database servers and an S3 server share two cores with the rest of
// the package's tests.
const replicaWait = 90 * time.Second

// dbHost is a database server the scenarios put CubeMaster's database on.
type dbHost struct {
	dialect              dbserver.Dialect
	addr, user, password string
	newDatabase          func(testing.TB) dbserver.Database
	// stop and start take the server down and bring it back on the same
	// address, with its data.
	stop  func()
	start func(context.Context) error
}

func mariaDBHost(m *dbserver.MySQL) dbHost {
	return dbHost{dialect: dbserver.MySQLDialect, addr: m.Addr, user: m.User, password: m.Password,
		newDatabase: m.NewDatabase, stop: m.Stop, start: m.Start}
}

func postgresHost(p *dbserver.Postgres) dbHost {
	return dbHost{dialect: dbserver.PostgresDialect, addr: p.Addr, user: p.User, password: p.Password,
		newDatabase: p.NewDatabase, stop: p.Stop, start: p.Start}
}

// sharedHost is the package's server of dialect d.
func sharedHost(t testing.TB, d dbserver.Dialect) dbHost {
	t.Helper()
	if d == dbserver.PostgresDialect {
		return postgresHost(dbservers.Postgres(t))
	}
	return mariaDBHost(dbservers.MariaDB(t))
}

// forDialects runs f as a subtest on MariaDB and on PostgreSQL, each with
// the server host returns; in parallel with each other when parallel is
// set.
func forDialects(t *testing.T, parallel bool, host func(testing.TB, dbserver.Dialect) dbHost, f func(*testing.T, dbHost)) {
	t.Helper()
	for _, c := range []struct {
		name    string
		dialect dbserver.Dialect
	}{{"MariaDB", dbserver.MySQLDialect}, {"Postgres", dbserver.PostgresDialect}} {
		t.Run(c.name, func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			f(t, host(t, c.dialect))
		})
	}
}

// layerGate holds back downloads of the layer blobs it knows while it is
// closed, so a build that reached them keeps running (and holding its build
// lock) until the test opens it. Manifests and image configurations pass:
// replicas resolve the image and compute the fingerprint before the lock.
type layerGate struct {
	mu       sync.Mutex
	digests  map[string]bool
	release  chan struct{} // closed while the gate is open
	arrivals int
	changed  chan struct{}
}

func newLayerGate() *layerGate {
	g := &layerGate{digests: map[string]bool{}, release: make(chan struct{}), changed: make(chan struct{})}
	close(g.release)
	return g
}

// add puts the layer blobs digests behind the gate.
func (g *layerGate) add(digests ...v1.Hash) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, d := range digests {
		g.digests[d.String()] = true
	}
}

// shut closes the gate: layer downloads from now on wait.
func (g *layerGate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.release:
		g.release = make(chan struct{})
	default:
	}
}

// open lets every waiting and later layer download through.
func (g *layerGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}

// wrap is the registry wrapper that applies the gate.
func (g *layerGate) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d, ok := images.BlobDigest(r); ok && r.Method == http.MethodGet {
			g.mu.Lock()
			gated := g.digests[d]
			release := g.release
			if gated {
				g.arrivals++
				close(g.changed)
				g.changed = make(chan struct{})
			}
			g.mu.Unlock()
			if gated {
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// arrived is how many gated layer downloads were asked for so far.
func (g *layerGate) arrived() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.arrivals
}

// waitArrivals waits until n gated layer downloads were asked for since
// the registry started.
func (g *layerGate) waitArrivals(t testing.TB, n int) {
	t.Helper()
	deadline := time.After(replicaWait)
	for {
		g.mu.Lock()
		got, ch := g.arrivals, g.changed
		g.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("layer downloads: %d within %s, want %d", got, replicaWait, n)
		}
	}
}

// replicaSetup is one CubeMaster deployment: a fresh database with
// CubeMaster's schema, the stand-in keeping it, a registry behind a layer
// gate, and an S3 prefix of the package's bucket for this test alone.
type replicaSetup struct {
	t      testing.TB
	host   dbHost
	dbName string
	db     *sql.DB
	cm     *cubemaster.Server
	reg    *images.Registry
	gate   *layerGate
	s3     *s3server.Server
	prefix string
}

func newReplicaSetup(t testing.TB, host dbHost) *replicaSetup {
	t.Helper()
	d := host.newDatabase(t)
	db := d.Open(t)
	if err := dbserver.CreateCubeMasterSchema(bounded(t), db, d.Dialect); err != nil {
		t.Fatal(err)
	}
	cm := startCubeMaster(t, testToken)
	if err := cm.UseDatabase(db, string(d.Dialect)); err != nil {
		t.Fatal(err)
	}
	gate := newLayerGate()
	return &replicaSetup{t: t, host: host, dbName: d.Name, db: db, cm: cm, gate: gate,
		// Database names are numbered per server and cut to 48 bytes: the
		// dialect keeps two servers' tests apart in the shared bucket.
		reg: images.StartRegistry(t, gate.wrap), s3: s3srv.Get(t), prefix: "replicas/" + string(d.Dialect) + "/" + d.Name}
}

// bounded is a context for one database or store call of a test.
func bounded(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pushImage pushes a small image of its own (a few files, one of them
// random, so no two share a layer) as repo:v1, puts its layer behind the
// gate, and returns its reference and layer digest.
func (s *replicaSetup) pushImage(repo string) (ref string, layer v1.Hash) {
	s.t.Helper()
	noise := make([]byte, 64<<10)
	rand.Read(noise)
	img := images.New(s.t, images.Config{}, images.Layer{Tar: images.TarOf(s.t, map[string]string{
		"etc/hostname": repo, "etc/motd": "replica scenario " + repo, "data/noise": string(noise)})})
	digests := images.LayerDigests(s.t, img)
	s.gate.add(digests...)
	return s.reg.Push(s.t, "replicas/"+repo+":v1", img), digests[0]
}

// replicaAgent is one TC replica of a setup: its own store, spool, work
// directory and port.
type replicaAgent struct {
	name string
	h    *harness
	p    *proc
}

// newAgent prepares a replica on the setup's database and bucket, with
// fast lock polls and sweeps; start runs it.
func (s *replicaSetup) newAgent(name string) *replicaAgent {
	s.t.Helper()
	h := newHarness(s.t, s.cm.URL(), testToken)
	h.set("registry.insecure", []string{s.reg.Host})
	sslmode := ""
	if s.host.dialect == dbserver.PostgresDialect {
		sslmode = "disable"
	}
	h.cfg["instance_db_config"] = map[string]any{"driver": string(s.host.dialect), "addr": s.host.addr,
		"user": s.host.user, "pwd": s.host.password, "db_name": s.dbName, "sslmode": sslmode}
	h.cfg["replicas"] = map[string]any{"lock_poll_interval": "500ms", "reconcile_interval": "1s"}
	for k, v := range s3Env(s.s3, s.s3.Endpoint, s.prefix) {
		h.env[k] = v
	}
	// Every replica signs and trusts the same records beside objects.
	h.env["CUBE_TEMPLATE_CENTER_RECORD_SECRET"] = "record secret shared by the scenario's replicas"
	return &replicaAgent{name: name, h: h}
}

// startAgents prepares and starts n replicas named "replica 1".."replica n".
func (s *replicaSetup) startAgents(n int) []*replicaAgent {
	s.t.Helper()
	var out []*replicaAgent
	for i := range n {
		a := s.newAgent(fmt.Sprintf("replica %d", i+1))
		a.start()
		out = append(out, a)
	}
	return out
}

func (a *replicaAgent) start(extraEnv ...string) { a.p = a.h.startAgent(a.name, extraEnv...) }

func (a *replicaAgent) base() string { return a.h.baseURL() }

// log is everything the replica printed in its current run.
func (a *replicaAgent) log() string { return a.p.out.String() }

// storeDir is the replica's local artifact store.
func (a *replicaAgent) storeDir() string { return a.h.cfg["store"]["dir"].(string) }

// localArtifacts lists the artifact directories of the replica's store.
func (a *replicaAgent) localArtifacts(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(a.storeDir())
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "rfs-") {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// buildBody inserts jobID's row, as CubeMaster does before it posts a
// build, and returns the body to post: a build of image without the egress
// CA, with template's fields on top.
func (s *replicaSetup) buildBody(jobID, image string, template map[string]any) []byte {
	s.t.Helper()
	tmpl := map[string]any{"with_cube_ca": false}
	for k, v := range template {
		tmpl[k] = v
	}
	body, err := s.cm.CreateBuildRequest(bounded(s.t), jobID, image, tmpl)
	if err != nil {
		s.t.Fatal(err)
	}
	data, err := json.Marshal(body)
	if err != nil {
		s.t.Fatal(err)
	}
	return data
}

// postBuild posts body to a replica's build endpoint; safe to call from
// any goroutine.
func postBuild(base string, body []byte) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/tc/api/v1/build", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(tokenHeader, testToken)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("post build: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw), err
}

// submitJob creates jobID's row and posts its build of image to a, which
// must accept it.
func (s *replicaSetup) submitJob(a *replicaAgent, jobID, image string, template map[string]any) {
	s.t.Helper()
	if code, body, err := postBuild(a.base(), s.buildBody(jobID, image, template)); err != nil || code != http.StatusOK {
		s.t.Fatalf("%s: submit %s = %d %s, %v; want 200", a.name, jobID, code, body, err)
	}
}

// submitAtOnce creates the rows of every job, then posts each to its
// replica concurrently; every post must be accepted.
func (s *replicaSetup) submitAtOnce(jobs map[string]*replicaAgent, image string) {
	s.t.Helper()
	bodies := map[string][]byte{}
	for id := range jobs {
		bodies[id] = s.buildBody(id, image, nil)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var problems []string
	for id, a := range jobs {
		wg.Go(func() {
			code, body, err := postBuild(a.base(), bodies[id])
			if err != nil || code != http.StatusOK {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("%s: submit %s = %d %s, %v", a.name, id, code, body, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, p := range problems {
		s.t.Error(p)
	}
	if len(problems) > 0 {
		s.t.FailNow()
	}
}

// waitBuilt waits for jobID's accepted terminal report and fails unless it
// is BUILT.
func (s *replicaSetup) waitBuilt(jobID string) cubemaster.Callback {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), replicaWait)
	defer cancel()
	cb, err := s.cm.WaitTerminal(ctx, jobID)
	if err != nil {
		s.t.Fatalf("job %s: %v", jobID, err)
	}
	if cb.Field("status") != "BUILT" {
		s.t.Fatalf("job %s ended %s, want BUILT: %v", jobID, cb.Field("status"), cb.Body)
	}
	return cb
}

// fingerprintOf is the fingerprint the replica reported for jobID.
func (s *replicaSetup) fingerprintOf(jobID string) string {
	s.t.Helper()
	for _, c := range s.cm.Callbacks(jobID) {
		if fp := c.Field("template_spec_fingerprint"); fp != "" {
			return fp
		}
	}
	s.t.Fatalf("job %s: no report named its fingerprint", jobID)
	return ""
}

// rows is the artifact table.
func (s *replicaSetup) rows() []cubemaster.ArtifactRow {
	s.t.Helper()
	rows, err := s.cm.ArtifactRows(bounded(s.t))
	if err != nil {
		s.t.Fatal(err)
	}
	return rows
}

// row is the artifact row of id; ok is false when there is none.
func (s *replicaSetup) row(id string) (cubemaster.ArtifactRow, bool) {
	s.t.Helper()
	for _, r := range s.rows() {
		if r.ArtifactID == id {
			return r, true
		}
	}
	return cubemaster.ArtifactRow{}, false
}

// exec runs a statement written with ? placeholders and {now} on the
// database.
func (s *replicaSetup) exec(q string, args ...any) {
	s.t.Helper()
	if err := s.cm.Exec(context.Background(), q, args...); err != nil {
		s.t.Fatalf("%s: %v", q, err)
	}
}

// markCleanupPending sets an artifact row CLEANUP_PENDING as CubeMaster
// does before its delete call, updated now.
func (s *replicaSetup) markCleanupPending(id string) {
	s.t.Helper()
	s.exec("UPDATE t_cube_rootfs_artifact SET status = 'CLEANUP_PENDING', updated_at = {now} WHERE artifact_id = ?", id)
}

// objects lists the keys under the setup's prefix of the bucket.
func (s *replicaSetup) objects() []string {
	s.t.Helper()
	var keys []string
	for obj := range s.s3.Client().ListObjects(bounded(s.t), s.s3.Bucket, minio.ListObjectsOptions{Prefix: s.prefix + "/", Recursive: true}) {
		if obj.Err != nil {
			s.t.Fatalf("list objects: %v", obj.Err)
		}
		keys = append(keys, obj.Key)
	}
	slices.Sort(keys)
	return keys
}

// artifactKeys are the object and record keys of artifact id.
func (s *replicaSetup) artifactKeys(id string) []string {
	return []string{s.prefix + "/" + id + ".ext4", s.prefix + "/" + id + ".json"}
}

// metrics reads every series of base/metrics, by name and labels as
// exposed (`name{label="v"}`).
func metrics(t testing.TB, base string) map[string]float64 {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(base + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", base, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape %s: %q: %v", base, line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape %s: %v", base, err)
	}
	return out
}

// sumMetric adds one series over the replicas.
func sumMetric(t testing.TB, agents []*replicaAgent, series string) float64 {
	t.Helper()
	total := 0.0
	for _, a := range agents {
		v, ok := metrics(t, a.base())[series]
		if !ok {
			t.Fatalf("%s exposes no %s", a.name, series)
		}
		total += v
	}
	return total
}

// countLines counts the lines of text holding every substring.
func countLines(text string, subs ...string) int {
	n := 0
	for line := range strings.Lines(text) {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			n++
		}
	}
	return n
}

// waitingReplicas returns the replicas that logged waiting for another's
// build lock.
func waitingReplicas(agents []*replicaAgent) []*replicaAgent {
	var out []*replicaAgent
	for _, a := range agents {
		if strings.Contains(a.log(), "another replica is building this artifact; waiting for it") {
			out = append(out, a)
		}
	}
	return out
}

// pathExists reports whether path exists.
func pathExists(t testing.TB, path string) bool {
	t.Helper()
	_, err := os.Stat(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// artifactDir is artifact id's directory in a replica's store.
func (a *replicaAgent) artifactDir(id string) string { return filepath.Join(a.storeDir(), id) }

// lockHeldElsewhere reports whether another session holds the session
// lock name, asked on a connection of the test's own.
func (s *replicaSetup) lockHeldElsewhere(name string) bool {
	s.t.Helper()
	ctx := bounded(s.t)
	conn, err := s.db.Conn(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	if s.host.dialect == dbserver.PostgresDialect {
		var got bool
		if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", name).Scan(&got); err != nil {
			s.t.Fatal(err)
		}
		if got {
			conn.ExecContext(ctx, "SELECT pg_advisory_unlock(hashtext($1))", name)
		}
		return !got
	}
	var free sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT IS_FREE_LOCK(?)", name).Scan(&free); err != nil {
		s.t.Fatal(err)
	}
	return free.Valid && free.Int64 == 0
}
