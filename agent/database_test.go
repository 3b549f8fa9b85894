package agent

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/spool"
	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
)

// dbs are the package's MariaDB and PostgreSQL, started on first use.
var dbs dbserver.Shared

// dbServer is what the outage test does to a shared server.
type dbServer interface {
	Stop()
	Start(ctx context.Context) error
}

// stopServer stops a shared database server; the returned restart (also
// run at cleanup, when not called before) brings it back.
func stopServer(t *testing.T, srv dbServer) (restart func()) {
	t.Helper()
	srv.Stop()
	started := false
	restart = func() {
		if started {
			return
		}
		started = true
		if err := srv.Start(context.Background()); err != nil {
			t.Fatalf("restart database: %v", err)
		}
	}
	t.Cleanup(restart)
	return restart
}

// dbDialect opens a fresh CubeMaster database on one of the shared servers.
type dbDialect struct {
	name   string
	driver string
	open   func(t *testing.T) (masterdb.Options, dbserver.Database, dbServer)
}

var dbDialects = []dbDialect{
	{"MySQL", masterdb.DriverMySQL, func(t *testing.T) (masterdb.Options, dbserver.Database, dbServer) {
		srv := dbs.MariaDB(t)
		d := srv.NewDatabase(t)
		return masterdb.Options{Driver: masterdb.DriverMySQL, Addr: srv.Addr, User: srv.User, Password: srv.Password, DBName: d.Name,
			ConnTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, MaxOpenConns: 4, MaxIdleConns: 2}, d, srv
	}},
	{"Postgres", masterdb.DriverPostgres, func(t *testing.T) (masterdb.Options, dbserver.Database, dbServer) {
		srv := dbs.Postgres(t)
		d := srv.NewDatabase(t)
		return masterdb.Options{Driver: masterdb.DriverPostgres, Addr: srv.Addr, User: srv.User, Password: srv.Password, DBName: d.Name,
			ConnTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, MaxOpenConns: 4, MaxIdleConns: 2, SSLMode: "disable"}, d, srv
	}},
}

// insertJobRow adds a job row as CubeMaster does before it submits;
// snapshot "" stores NULL.
func insertJobRow(t *testing.T, db *sql.DB, driver, jobID, status, snapshot string) {
	t.Helper()
	q := "INSERT INTO t_cube_template_image_job (job_id, status, request_json) VALUES (?, ?, ?)"
	if driver == masterdb.DriverPostgres {
		q = "INSERT INTO t_cube_template_image_job (job_id, status, request_json) VALUES ($1, $2, $3)"
	}
	var req any
	if snapshot != "" {
		req = snapshot
	}
	if _, err := db.Exec(q, jobID, status, req); err != nil {
		t.Fatalf("insert job %s: %v", jobID, err)
	}
}

// snapshotOf is the request_json CubeMaster stores for a build body: the
// request without its registry password.
func snapshotOf(t *testing.T, body map[string]any) string {
	t.Helper()
	req := map[string]any{}
	for k, v := range body["request"].(map[string]any) {
		if k != "registry_password" {
			req[k] = v
		}
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSubmitCheckedAgainstJobRow(t *testing.T) {
	for _, dl := range dbDialects {
		t.Run(dl.name, func(t *testing.T) {
			opts, d, srv := dl.open(t)
			seed := d.Open(t)
			if err := dbserver.CreateCubeMasterSchema(context.Background(), seed, d.Dialect); err != nil {
				t.Fatal(err)
			}
			db, err := masterdb.Open(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			h := newHarness(t, nil)
			h.database = db
			h.start()

			withPassword := func(id, ref string) map[string]any {
				b := buildBody(id, ref)
				b["request"].(map[string]any)["registry_password"] = "registry-s3cret"
				return b
			}
			okBody := withPassword("job-ok", "alpine:3")
			insertJobRow(t, seed, dl.driver, "job-ok", "PENDING", snapshotOf(t, okBody))
			insertJobRow(t, seed, dl.driver, "job-running", "RUNNING", "")
			insertJobRow(t, seed, dl.driver, "job-failed", "FAILED", "")
			insertJobRow(t, seed, dl.driver, "job-lower", "pending", "")
			insertJobRow(t, seed, dl.driver, "job-other", "PENDING", snapshotOf(t, buildBody("job-other", "alpine:4")))
			insertJobRow(t, seed, dl.driver, "job-later", "PENDING", "")
			insertJobRow(t, seed, dl.driver, "job-corrupt", "PENDING", "[not an object")

			cases := []struct {
				id   string
				body map[string]any
				code int
				msg  string
			}{
				{"job-ok", okBody, http.StatusOK, ""},
				{"job-running", buildBody("job-running", "alpine:3"), http.StatusOK, ""},
				{"job-missing", buildBody("job-missing", "alpine:3"), http.StatusNotFound, "build job not found"},
				{"job-failed", buildBody("job-failed", "alpine:3"), http.StatusNotFound, `status is "FAILED"`},
				{"job-lower", buildBody("job-lower", "alpine:3"), http.StatusNotFound, `status is "pending"`},
				{"job-other", buildBody("job-other", "alpine:3"), http.StatusBadRequest, "request does not match the job's stored request"},
				// A snapshot that cannot be compared is never taken as a match.
				{"job-corrupt", buildBody("job-corrupt", "alpine:3"), http.StatusInternalServerError, "request_json"},
				{"JOB-OK", buildBody("JOB-OK", "alpine:3"), http.StatusNotFound, "build job not found"},
			}
			for _, c := range cases {
				code, body := h.post("/tc/api/v1/build", c.body)
				if code != c.code || (c.msg != "" && !strings.Contains(body["error"].(string), c.msg)) {
					t.Errorf("submit %s = %d %v, want %d %q", c.id, code, body, c.code, c.msg)
				}
				_, err := h.sp.Job(context.Background(), c.id)
				if accepted := err == nil; accepted != (c.code == http.StatusOK) {
					t.Errorf("submit %s answered %d but spool lookup = %v", c.id, code, err)
				}
				if c.code != http.StatusOK && !errors.Is(err, spool.ErrNotFound) {
					t.Errorf("refused job %s in spool: %v", c.id, err)
				}
			}
			if cb := h.terminal("job-ok"); cb.Field("status") != "BUILT" {
				t.Errorf("job-ok ended %v, want BUILT", cb.Body)
			}
			if code, body := h.health(false); code != http.StatusOK || !body.Checks["database"] {
				t.Errorf("health = %d %v, want 200 with database true", code, body)
			}

			// Outage: never accepted unchecked; 503, which CubeMaster
			// retries, and accepted once the database is back.
			restart := stopServer(t, srv)
			code, body := h.post("/tc/api/v1/build", buildBody("job-later", "alpine:3"))
			if code != http.StatusServiceUnavailable {
				t.Errorf("submit with the database down = %d %v, want 503", code, body)
			}
			if _, err := h.sp.Job(context.Background(), "job-later"); !errors.Is(err, spool.ErrNotFound) {
				t.Errorf("job submitted during the outage is in the spool: %v", err)
			}
			if code, body := h.waitHealth("the database down", func(code int, _ healthBody) bool { return code != http.StatusOK }); code != http.StatusServiceUnavailable || body.Checks["database"] {
				t.Errorf("health with the database down = %d %v, want 503 with database false", code, body)
			}
			restart()
			h.submit("job-later", "alpine:3")
			if cb := h.terminal("job-later"); cb.Field("status") != "BUILT" {
				t.Errorf("job-later ended %v, want BUILT", cb.Body)
			}
		})
	}
}

// TestSubmitWithoutDatabase: with no database configured nothing is
// checked and /health has no database check, as before.
func TestSubmitWithoutDatabase(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.submit("job-nodb", "alpine:3")
	if code, body := h.health(false); code != http.StatusOK {
		t.Errorf("health = %d %v", code, body)
	} else if _, ok := body.Checks["database"]; ok {
		t.Errorf("health has a database check without a database: %v", body)
	}
}
