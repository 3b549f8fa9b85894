package dbserver

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
)

// servers are this package's shared servers; the options prove that
// WithVar reaches each server (TestServerVars).
var servers = Shared{
	MariaDBOptions:  []Option{WithVar("wait_timeout", "5")},
	PostgresOptions: []Option{WithVar("work_mem", "8MB")},
	RedisOptions:    []Option{WithVar("hz", "20")},
}

func TestMain(m *testing.M) {
	code := m.Run()
	servers.Close()
	os.Exit(code)
}

// dialects runs f against a fresh database on each shared SQL server.
func dialects(t *testing.T, f func(t *testing.T, d Database)) {
	t.Run("MariaDB", func(t *testing.T) { f(t, servers.MariaDB(t).NewDatabase(t)) })
	t.Run("Postgres", func(t *testing.T) { f(t, servers.Postgres(t).NewDatabase(t)) })
}

// ph returns the dialect's n-th placeholder.
func ph(d Dialect, n int) string {
	if d == PostgresDialect {
		return "$" + string(rune('0'+n))
	}
	return "?"
}

func TestConnectWithPassword(t *testing.T) {
	ctx := context.Background()
	m := servers.MariaDB(t)
	pg := servers.Postgres(t)
	for _, c := range []struct {
		name           string
		driver, good   string
		bad            string
		wantDenied     func(error) bool
		wantUser, want string
	}{
		{"MariaDB", "mysql", m.DSN(), strings.Replace(m.DSN(), m.Password, "wrong", 1),
			func(err error) bool {
				var me *mysql.MySQLError
				return errors.As(err, &me) && me.Number == 1045 // ER_ACCESS_DENIED_ERROR
			}, "SELECT CURRENT_USER()", m.User + "@%"},
		{"Postgres", "pgx", pg.DSN(), strings.Replace(pg.DSN(), pg.Password, "wrong", 1),
			func(err error) bool {
				var pe *pgconn.PgError
				return errors.As(err, &pe) && pe.Code == "28P01" // invalid_password
			}, "SELECT current_user", pg.User},
	} {
		t.Run(c.name, func(t *testing.T) {
			db, err := sql.Open(c.driver, c.good)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var user string
			if err := db.QueryRowContext(ctx, c.wantUser).Scan(&user); err != nil || user != c.want {
				t.Fatalf("%s = %q, %v; want %q", c.wantUser, user, err, c.want)
			}
			bad, err := sql.Open(c.driver, c.bad)
			if err != nil {
				t.Fatal(err)
			}
			defer bad.Close()
			if err := bad.PingContext(ctx); !c.wantDenied(err) {
				t.Fatalf("Ping with a wrong password: %v; want access denied", err)
			}
		})
	}
}

func TestCubeMasterSchemaRoundTrip(t *testing.T) {
	dialects(t, func(t *testing.T, d Database) {
		ctx := context.Background()
		db := d.Open(t)
		if err := CreateCubeMasterSchema(ctx, db, d.Dialect); err != nil {
			t.Fatal(err)
		}
		p1, p2, p3 := ph(d.Dialect, 1), ph(d.Dialect, 2), ph(d.Dialect, 3)
		if _, err := db.ExecContext(ctx, "INSERT INTO t_cube_template_image_job (job_id, status, request_json) VALUES ("+
			p1+", "+p2+", "+p3+")", "job-1", "PENDING", `{"a":1}`); err != nil {
			t.Fatalf("insert job: %v", err)
		}
		var (
			status, request, operation string
			attempt, progress          int
			created                    time.Time
			deleted                    sql.NullTime
		)
		err := db.QueryRowContext(ctx, "SELECT status, request_json, operation, attempt_no, progress, created_at, deleted_at FROM t_cube_template_image_job WHERE job_id = "+p1,
			"job-1").Scan(&status, &request, &operation, &attempt, &progress, &created, &deleted)
		if err != nil {
			t.Fatalf("select job: %v", err)
		}
		if status != "PENDING" || request != `{"a":1}` || operation != "CREATE" || attempt != 1 || progress != 0 || created.IsZero() || deleted.Valid {
			t.Errorf("job row = %q %q %q %d %d %v %v; want PENDING, the request, the defaults CREATE 1 0, a creation time, no deletion",
				status, request, operation, attempt, progress, created, deleted)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO t_cube_template_image_job (job_id, status) VALUES ("+p1+", "+p2+")", "job-1", "PENDING"); err == nil {
			t.Error("second job row with the same job_id accepted; want idx_job_id to reject it")
		}

		baked := true
		if _, err := db.ExecContext(ctx, "INSERT INTO t_cube_rootfs_artifact (artifact_id, template_spec_fingerprint, status, cube_egress_ca_baked, gc_deadline) VALUES ("+
			p1+", "+p2+", 'READY', "+p3+", "+ph(d.Dialect, 4)+")", "art-1", "fp-1", baked, time.Now().Add(7*24*time.Hour)); err != nil {
			t.Fatalf("insert artifact: %v", err)
		}
		var (
			artifactID, backend string
			gotBaked            bool
			size                int64
			gc                  sql.NullTime
		)
		err = db.QueryRowContext(ctx, "SELECT artifact_id, storage_backend, cube_egress_ca_baked, ext4_size_bytes, gc_deadline FROM t_cube_rootfs_artifact WHERE template_spec_fingerprint = "+p1,
			"fp-1").Scan(&artifactID, &backend, &gotBaked, &size, &gc)
		if err != nil {
			t.Fatalf("select artifact: %v", err)
		}
		if artifactID != "art-1" || backend != "" || !gotBaked || size != 0 || !gc.Valid {
			t.Errorf("artifact row = %q %q %v %d %v; want art-1, '', true, 0, a gc deadline", artifactID, backend, gotBaked, size, gc)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO t_cube_rootfs_artifact (artifact_id, template_spec_fingerprint, status) VALUES ("+p1+", "+p2+", 'READY')", "art-2", "fp-1"); err == nil {
			t.Error("second artifact row for the same fingerprint accepted; want idx_artifact_fingerprint to reject it")
		}
	})
}

func TestDatabasesAreFresh(t *testing.T) {
	dialects(t, func(t *testing.T, d Database) {
		ctx := context.Background()
		if err := CreateCubeMasterSchema(ctx, d.Open(t), d.Dialect); err != nil {
			t.Fatal(err)
		}
		var other Database
		if d.Dialect == MySQLDialect {
			other = servers.MariaDB(t).NewDatabase(t)
		} else {
			other = servers.Postgres(t).NewDatabase(t)
		}
		if other.Name == d.Name {
			t.Fatalf("NewDatabase returned %s twice", d.Name)
		}
		// The schema does not exist in the second database: creating it works.
		if err := CreateCubeMasterSchema(ctx, other.Open(t), d.Dialect); err != nil {
			t.Fatalf("schema in a second fresh database: %v", err)
		}
	})
}

func TestServerVars(t *testing.T) {
	ctx := context.Background()
	var wait int
	if err := servers.MariaDB(t).NewDatabase(t).Open(t).QueryRowContext(ctx, "SELECT @@GLOBAL.wait_timeout").Scan(&wait); err != nil || wait != 5 {
		t.Errorf("@@GLOBAL.wait_timeout = %d, %v; want 5 from WithVar", wait, err)
	}
	var workMem string
	if err := servers.Postgres(t).NewDatabase(t).Open(t).QueryRowContext(ctx, "SHOW work_mem").Scan(&workMem); err != nil || workMem != "8MB" {
		t.Errorf("SHOW work_mem = %q, %v; want 8MB from WithVar", workMem, err)
	}
	c := servers.Redis(t).Client()
	defer c.Close()
	if got, err := c.ConfigGet(ctx, "hz").Result(); err != nil || got["hz"] != "20" {
		t.Errorf("CONFIG GET hz = %v, %v; want 20 from WithVar", got, err)
	}
}

func TestMariaDBWaitTimeout(t *testing.T) {
	ctx := context.Background()
	db := servers.MariaDB(t).NewDatabase(t).Open(t)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var id int64
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "SET SESSION wait_timeout = 1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // idle past the session's wait_timeout
	var n int
	if err := conn.QueryRowContext(ctx, "SELECT 1").Scan(&n); err == nil {
		t.Fatal("query on a connection idle past wait_timeout succeeded; want the server to have dropped it")
	}
	var alive int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id).Scan(&alive); err != nil || alive != 0 {
		t.Fatalf("connection %d in the process list: %d, %v; want it gone", id, alive, err)
	}
}

// lockOps are a dialect's session-lock statements, each answering one boolean.
type lockOps struct{ try, release string }

func TestSessionLocks(t *testing.T) {
	ops := map[Dialect]lockOps{
		MySQLDialect:    {"SELECT GET_LOCK('tc_build_x', 0) = 1", "SELECT RELEASE_LOCK('tc_build_x') = 1"},
		PostgresDialect: {"SELECT pg_try_advisory_lock(hashtext('tc_build_x'))", "SELECT pg_advisory_unlock(hashtext('tc_build_x'))"},
	}
	dialects(t, func(t *testing.T, d Database) {
		ctx := context.Background()
		db := d.Open(t)
		op := ops[d.Dialect]
		var a, b *sql.Conn
		for _, c := range []**sql.Conn{&a, &b} {
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			*c = conn
		}
		ask := func(conn *sql.Conn, name, q string) bool {
			t.Helper()
			var ok bool
			if err := conn.QueryRowContext(ctx, q).Scan(&ok); err != nil {
				t.Fatalf("%s: %s: %v", name, q, err)
			}
			return ok
		}
		if !ask(a, "a", op.try) {
			t.Fatal("first connection did not get the free lock")
		}
		if ask(b, "b", op.try) {
			t.Fatal("second connection got the lock the first holds")
		}
		if !ask(a, "a", op.release) {
			t.Fatal("first connection could not release its lock")
		}
		if !ask(b, "b", op.try) {
			t.Fatal("second connection did not get the lock after its release")
		}
		if !ask(b, "b", op.release) {
			t.Fatal("second connection could not release its lock")
		}
	})
}

func TestRedisPassword(t *testing.T) {
	ctx := context.Background()
	r := servers.Redis(t)
	c := r.Client()
	defer c.Close()
	key := "template_image_job_pull_progress:job-1"
	if err := c.HSet(ctx, key, "job_id", "job-1", "pull_total_bytes", 100, "pull_downloaded_bytes", 40).Err(); err != nil {
		t.Fatalf("HSET: %v", err)
	}
	if ok, err := c.Expire(ctx, key, time.Hour).Result(); err != nil || !ok {
		t.Fatalf("EXPIRE = %v, %v; want true", ok, err)
	}
	if ttl, err := c.TTL(ctx, key).Result(); err != nil || ttl <= 0 || ttl > time.Hour {
		t.Fatalf("TTL = %v, %v; want (0, 1h]", ttl, err)
	}
	got, err := c.HGetAll(ctx, key).Result()
	if err != nil || got["job_id"] != "job-1" || got["pull_downloaded_bytes"] != "40" || len(got) != 3 {
		t.Fatalf("HGETALL = %v, %v; want the three fields", got, err)
	}
	if n, err := c.Del(ctx, key).Result(); err != nil || n != 1 {
		t.Fatalf("DEL = %d, %v; want 1", n, err)
	}
	for _, pw := range []string{"wrong", ""} {
		bad := redis.NewClient(&redis.Options{Addr: r.Addr, Password: pw, MaxRetries: -1})
		err := bad.HSet(ctx, key, "job_id", "x").Err()
		bad.Close()
		if err == nil || !(strings.Contains(err.Error(), "WRONGPASS") || strings.Contains(err.Error(), "NOAUTH")) {
			t.Errorf("HSET with password %q: %v; want WRONGPASS or NOAUTH", pw, err)
		}
	}
	if n, err := c.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Errorf("EXISTS after rejected writes = %d, %v; want 0", n, err)
	}
}

// TestStopStart stops each shared server and starts it again: same address,
// connections refused in between, SQL data kept.
func TestStopStart(t *testing.T) {
	ctx := context.Background()
	dialects(t, func(t *testing.T, d Database) {
		db := d.Open(t)
		if _, err := db.ExecContext(ctx, "CREATE TABLE kept (v INT)"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO kept VALUES (7)"); err != nil {
			t.Fatal(err)
		}
		var stop func()
		var start func(context.Context) error
		var addr func() string
		if d.Dialect == MySQLDialect {
			m := servers.MariaDB(t)
			stop, start, addr = m.Stop, m.Start, func() string { return m.Addr }
		} else {
			pg := servers.Postgres(t)
			stop, start, addr = pg.Stop, pg.Start, func() string { return pg.Addr }
		}
		before := addr()
		stop()
		t.Cleanup(func() { start(ctx) }) // the server is shared: never leave it down
		if conn, err := net.Dial("tcp", before); err == nil {
			conn.Close()
			t.Fatalf("%s accepts connections after Stop", before)
		}
		if err := db.PingContext(ctx); err == nil {
			t.Fatal("Ping succeeded against a stopped server")
		}
		if err := start(ctx); err != nil {
			t.Fatal(err)
		}
		if addr() != before {
			t.Fatalf("address after Start = %s; want %s", addr(), before)
		}
		var v int
		if err := db.QueryRowContext(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != 7 {
			t.Fatalf("row after restart = %d, %v; want 7", v, err)
		}
	})
	t.Run("Redis", func(t *testing.T) {
		r := servers.Redis(t)
		c := r.Client()
		defer c.Close()
		before := r.Addr
		r.Stop()
		t.Cleanup(func() { r.Start(ctx) })
		if err := c.Ping(ctx).Err(); err == nil {
			t.Fatal("PING succeeded against a stopped server")
		}
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if r.Addr != before {
			t.Fatalf("address after Start = %s; want %s", r.Addr, before)
		}
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING after restart: %v", err)
		}
	})
}

// TestStartCleanup checks that a test's own server is gone, with its
// directory, once the test ends.
func TestStartCleanup(t *testing.T) {
	var r *Redis
	t.Run("Own", func(t *testing.T) {
		r = StartRedis(t)
		if r.Addr == servers.Redis(t).Addr {
			t.Fatalf("StartRedis reused the shared server's address %s", r.Addr)
		}
	})
	if conn, err := net.Dial("tcp", r.Addr); err == nil {
		conn.Close()
		t.Errorf("%s still accepts connections after the test's cleanup", r.Addr)
	}
	if _, err := os.Stat(r.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Stat(%s) after cleanup: %v; want it removed", r.Dir, err)
	}
}

func TestMissingBinaryNamesMakeDeps(t *testing.T) {
	_, err := findBinary([]string{"no-such-server-tc"}, []string{t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "make deps") {
		t.Fatalf("findBinary(missing) error = %v; want one that says to run make deps", err)
	}
}

func TestSchemaStatements(t *testing.T) {
	for _, d := range []Dialect{MySQLDialect, PostgresDialect} {
		stmts, err := Schema(d)
		if err != nil {
			t.Fatal(err)
		}
		var tables []string
		for _, s := range stmts {
			if strings.Contains(s, "--") {
				t.Errorf("%s: statement keeps a comment: %q", d, firstLine(s))
			}
			if name, ok := strings.CutPrefix(firstLine(s), "CREATE TABLE "); ok {
				tables = append(tables, strings.TrimSuffix(name, " ("))
			}
		}
		if want := []string{"t_cube_template_image_job", "t_cube_rootfs_artifact"}; !slices.Equal(tables, want) {
			t.Errorf("Schema(%s) creates %v; want %v", d, tables, want)
		}
	}
	if _, err := Schema("sqlite"); err == nil {
		t.Error("Schema(sqlite) succeeded; want an unknown-dialect error")
	}
}
