// Package dbserver runs the real database servers that tests of CubeMaster's
// shared state need: MariaDB (CubeMaster's MySQL), PostgreSQL 15 and Redis,
// from Debian's packages, each on a free loopback port with its data in a
// temporary directory, as child processes of the test binary. It also creates
// the two CubeMaster tables (schema/*.sql) that TC reads and writes.
//
// The servers take seconds to initialize, so a test package starts each one
// once and gives every test its own fresh database on it:
//
//	var servers dbserver.Shared // package variable of the test package
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		servers.Close()
//		os.Exit(code)
//	}
//
//	func TestX(t *testing.T) {
//		db := servers.MariaDB(t).NewDatabase(t).Open(t) // CREATE DATABASE for this test
//		...
//	}
//
// Set Shared's option fields (e.g. MariaDBOptions:
// []dbserver.Option{dbserver.WithVar("wait_timeout", "5")})
// before the first use. A test that stops a shared server (Stop, to simulate
// an outage) starts it again before it returns and does not run in parallel;
// a test that needs a server of its own calls StartMariaDB, StartPostgres or
// StartRedis, which stop the server and remove its directory at cleanup.
//
// The servers run with a clean environment and no system option files
// (mariadbd --no-defaults), so nothing from /etc or the package's own
// services reaches them. As root, mariadbd runs with --user=root and
// postgres as the postgres system user (it refuses root), which then owns
// the server's directory. A server gets SIGKILL when the test binary dies.
//
// A missing server binary fails the test (it is never skipped) with an error
// that says to run `make deps`, which installs the Debian packages.
package dbserver
