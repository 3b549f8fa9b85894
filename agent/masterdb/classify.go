package masterdb

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// mysqlUnavailable are MySQL server errors that say "not now" rather than
// "never": too many connections, shutdown in progress, connection killed,
// server shutting down.
var mysqlUnavailable = map[uint16]bool{1040: true, 1053: true, 1927: true, 4031: true}

// Unavailable reports whether err means the database cannot be reached
// now: a refused, dropped or timed-out connection, or a server that is
// shutting down or out of connections. Errors the server answered with
// about the request itself (a wrong password, a missing table) are not.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// 08 connection exception, 53 insufficient resources (too many
		// connections), 57 operator intervention (shutdown, restart).
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "53") ||
			strings.HasPrefix(pgErr.Code, "57")
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		return mysqlUnavailable[myErr.Number]
	}
	var netErr net.Error
	switch {
	case errors.As(err, &netErr),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, driver.ErrBadConn),
		errors.Is(err, mysql.ErrInvalidConn),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	}
	return pgconn.Timeout(err)
}
