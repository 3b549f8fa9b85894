package masterdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
)

// servers are the package's MariaDB and PostgreSQL, started on first use.
var servers dbserver.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	servers.Close()
	os.Exit(code)
}

// dialect is one database server family the tests run against.
type dialect struct {
	name string
	// open creates a fresh database with CubeMaster's tables and returns
	// Options reaching it, a handle to seed rows, and the server.
	open func(t *testing.T) (Options, *sql.DB, server)
}

// server is what the outage tests do to a shared server.
type server interface {
	Stop()
	Start(ctx context.Context) error
}

var dialects = []dialect{
	{"MySQL", func(t *testing.T) (Options, *sql.DB, server) {
		srv := servers.MariaDB(t)
		d := srv.NewDatabase(t)
		return options(DriverMySQL, srv.Addr, srv.User, srv.Password, d.Name), seed(t, d), srv
	}},
	{"Postgres", func(t *testing.T) (Options, *sql.DB, server) {
		srv := servers.Postgres(t)
		d := srv.NewDatabase(t)
		o := options(DriverPostgres, srv.Addr, srv.User, srv.Password, d.Name)
		o.SSLMode = "disable"
		return o, seed(t, d), srv
	}},
}

func options(driver, addr, user, password, name string) Options {
	return Options{Driver: driver, Addr: addr, User: user, Password: password, DBName: name,
		ConnTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		MaxIdleConns: 2, MaxOpenConns: 4, MaxConnLifetime: time.Minute}
}

func seed(t *testing.T, d dbserver.Database) *sql.DB {
	t.Helper()
	db := d.Open(t)
	if err := dbserver.CreateCubeMasterSchema(context.Background(), db, d.Dialect); err != nil {
		t.Fatal(err)
	}
	return db
}

// insertJob adds a job row as CubeMaster does; request nil stores NULL.
func insertJob(t *testing.T, db *sql.DB, driver, jobID, status string, request *string, deleted bool) {
	t.Helper()
	q := "INSERT INTO t_cube_template_image_job (job_id, status, request_json, deleted_at) VALUES (?, ?, ?, ?)"
	if driver == DriverPostgres {
		q = "INSERT INTO t_cube_template_image_job (job_id, status, request_json, deleted_at) VALUES ($1, $2, $3, $4)"
	}
	var del any
	if deleted {
		del = time.Now().UTC()
	}
	var req any
	if request != nil {
		req = *request
	}
	if _, err := db.Exec(q, jobID, status, req, del); err != nil {
		t.Fatalf("insert job %s: %v", jobID, err)
	}
}

func openDB(t *testing.T, o Options) *DB {
	t.Helper()
	d, err := Open(context.Background(), o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestJobForSubmit(t *testing.T) {
	snapshot := `{"source_image_ref":"alpine:3","writable_layer_size":"1Gi"}`
	empty := ""
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			o, seedDB, _ := dl.open(t)
			insertJob(t, seedDB, o.Driver, "job-pending", JobPending, &snapshot, false)
			insertJob(t, seedDB, o.Driver, "job-running", JobRunning, nil, false)
			insertJob(t, seedDB, o.Driver, "job-ready", "READY", &empty, false)
			insertJob(t, seedDB, o.Driver, "job-deleted", JobPending, &snapshot, true)
			d := openDB(t, o)
			ctx := context.Background()
			if err := d.Ping(ctx); err != nil {
				t.Fatalf("Ping: %v", err)
			}
			for _, c := range []struct {
				id        string
				want      JobRow
				buildable bool
			}{
				{"job-pending", JobRow{JobID: "job-pending", Status: JobPending, RequestJSON: snapshot}, true},
				{"job-running", JobRow{JobID: "job-running", Status: JobRunning}, true},
				{"job-ready", JobRow{JobID: "job-ready", Status: "READY"}, false},
			} {
				got, err := d.JobForSubmit(ctx, c.id)
				if err != nil || got != c.want || got.Buildable() != c.buildable {
					t.Errorf("JobForSubmit(%s) = %+v, %v (buildable %v); want %+v, buildable %v", c.id, got, err,
						got.Buildable(), c.want, c.buildable)
				}
			}
			for _, id := range []string{"job-missing", "job-deleted", "job-pending' OR '1'='1", "JOB-PENDING", "job-pending "} {
				if _, err := d.JobForSubmit(ctx, id); !errors.Is(err, ErrJobNotFound) || errors.Is(err, ErrUnavailable) {
					t.Errorf("JobForSubmit(%q) error = %v, want ErrJobNotFound", id, err)
				}
			}
		})
	}
}

// TestUnavailable stops the shared server: a refused connection is
// ErrUnavailable, and the same pool works again once the server is back.
func TestUnavailable(t *testing.T) {
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			o, seedDB, srv := dl.open(t)
			insertJob(t, seedDB, o.Driver, "job-1", JobPending, nil, false)
			d := openDB(t, o)
			ctx := context.Background()
			if _, err := d.JobForSubmit(ctx, "job-1"); err != nil {
				t.Fatal(err)
			}
			srv.Stop()
			restarted := false
			t.Cleanup(func() {
				if !restarted {
					srv.Start(context.Background())
				}
			})
			if err := d.Ping(ctx); !errors.Is(err, ErrUnavailable) {
				t.Errorf("Ping with the server stopped = %v, want ErrUnavailable", err)
			}
			if _, err := d.JobForSubmit(ctx, "job-1"); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrJobNotFound) {
				t.Errorf("JobForSubmit with the server stopped = %v, want ErrUnavailable", err)
			}
			// Open tolerates an unreachable server: TC starts and answers 503.
			d2, err := Open(ctx, o)
			if err != nil {
				t.Errorf("Open with the server stopped = %v, want a pool", err)
			} else {
				d2.Close()
			}
			if err := srv.Start(ctx); err != nil {
				t.Fatalf("restart server: %v", err)
			}
			restarted = true
			if got, err := d.JobForSubmit(ctx, "job-1"); err != nil || got.Status != JobPending {
				t.Errorf("JobForSubmit after restart = %+v, %v", got, err)
			}
		})
	}
}

// TestOpenRefusesBadLogin: a wrong password or database is a
// configuration error, reported at Open, never taken for an outage.
func TestOpenRefusesBadLogin(t *testing.T) {
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			o, _, _ := dl.open(t)
			for name, edit := range map[string]func(*Options){
				"Password": func(o *Options) { o.Password = "wrong" },
				"Database": func(o *Options) { o.DBName = "no_such_db" },
			} {
				bad := o
				edit(&bad)
				d, err := Open(context.Background(), bad)
				if err == nil {
					d.Close()
					t.Errorf("%s: Open succeeded", name)
				} else if errors.Is(err, ErrUnavailable) || strings.Contains(err.Error(), "wrong") {
					t.Errorf("%s: Open = %v; want a configuration error that shows no password", name, err)
				}
			}
		})
	}
}

func TestDSN(t *testing.T) {
	o := options(DriverMySQL, "db.local:3306", "cube", "p@ss:w/rd", "cube_mvp")
	o.ConnTimeout, o.ReadTimeout, o.WriteTimeout = 3*time.Second, 4*time.Second, 5*time.Second
	drv, dsn, err := DSN(o)
	if err != nil || drv != "mysql" {
		t.Fatalf("DSN(mysql) = %q, %v", drv, err)
	}
	for _, want := range []string{"cube:p@ss:w/rd@tcp(db.local:3306)/cube_mvp", "timeout=3s", "readTimeout=4s", "writeTimeout=5s", "parseTime=true"} {
		if !strings.Contains(dsn, want) {
			t.Errorf("mysql DSN %q lacks %q", dsn, want)
		}
	}
	o.Driver, o.SSLMode, o.ConnTimeout = DriverPostgres, "verify-full", 1500*time.Millisecond
	drv, dsn, err = DSN(o)
	if err != nil || drv != "pgx" {
		t.Fatalf("DSN(postgres) = %q, %v", drv, err)
	}
	if want := "postgres://cube:p%40ss%3Aw%2Frd@db.local:3306/cube_mvp?connect_timeout=2&sslmode=verify-full"; dsn != want {
		t.Errorf("postgres DSN = %q, want %q", dsn, want)
	}
	if _, _, err := DSN(Options{Driver: "sqlite"}); err == nil {
		t.Error("DSN(sqlite) succeeded")
	}
}

func TestOptionsHidePassword(t *testing.T) {
	o := options(DriverMySQL, "db:3306", "cube", "hunter2-pw", "cube_mvp")
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("db", "opts", o)
	for _, out := range []string{fmt.Sprint(o), fmt.Sprintf("%+v", o), fmt.Sprintf("%#v", o), logged.String()} {
		if strings.Contains(out, "hunter2") || !strings.Contains(out, "mysql://cube@db:3306/cube_mvp") {
			t.Errorf("printed options = %q; want the address and no password", out)
		}
	}
}

func TestMatchesRequest(t *testing.T) {
	stored := `{"source_image_ref":"alpine:3","writable_layer_size":"1Gi","exposed_ports":[8080,80],` +
		`"container_overrides":{"envs":[{"key":"A","value":"1"}],"probe":null},"with_cube_ca":false,"future":{"x":1.50}}`
	cases := []struct {
		name      string
		stored    string
		submitted string
		want      bool
	}{
		{"Same", stored, stored, true},
		{"KeyOrderAndSpacing", stored, `{ "future":{"x":1.50}, "with_cube_ca":false, "writable_layer_size":"1Gi",
			"source_image_ref":"alpine:3","exposed_ports":[8080,80],"container_overrides":{"envs":[{"value":"1","key":"A"}]}}`, true},
		{"PasswordAndRequestIDIgnored", stored, strings.Replace(stored, "{", `{"registry_password":"s3cret","requestID":"req-9",`, 1), true},
		{"BlankedPasswordInSnapshot", strings.Replace(stored, "{", `{"registry_password":"","requestID":"req-1",`, 1), stored, true},
		{"NullIsAbsent", stored, strings.Replace(stored, "{", `{"alias":null,`, 1), true},
		{"EmptySnapshot", "", `{"source_image_ref":"other"}`, true},
		{"OtherImage", stored, strings.Replace(stored, "alpine:3", "alpine:4", 1), false},
		{"PortOrder", stored, strings.Replace(stored, "[8080,80]", "[80,8080]", 1), false},
		{"NumberAsWritten", stored, strings.Replace(stored, "1.50", "1.5", 1), false},
		{"FalseIsNotAbsent", stored, strings.Replace(stored, `"with_cube_ca":false,`, "", 1), false},
		{"UsernameBound", stored, strings.Replace(stored, "{", `{"registry_username":"bob",`, 1), false},
		{"UnknownFieldBound", stored, strings.Replace(stored, `"x":1.50`, `"x":1.50,"y":2`, 1), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := JobRow{JobID: "j", RequestJSON: c.stored}.MatchesRequest([]byte(c.submitted))
			if err != nil || got != c.want {
				t.Errorf("MatchesRequest = %v, %v; want %v", got, err, c.want)
			}
		})
	}
	for _, bad := range []string{"[1]", "{", `{"a":1} {}`, "null"} {
		if _, err := (JobRow{JobID: "j", RequestJSON: bad}).MatchesRequest([]byte(stored)); err == nil {
			t.Errorf("snapshot %q: no error", bad)
		}
	}
}

func TestUnavailableClassifiesPlainErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{context.DeadlineExceeded, true},
		{errors.New("syntax error"), false},
		{context.Canceled, false},
	} {
		if got := Unavailable(c.err); got != c.want {
			t.Errorf("Unavailable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
