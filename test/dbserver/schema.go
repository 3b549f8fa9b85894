package dbserver

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"strings"
)

// schemaFiles holds CubeMaster's two tables per dialect: the DDL tests
// create, and nothing else.
//
//go:embed schema/*.sql
var schemaFiles embed.FS

// Schema returns the DDL of CubeMaster's tables for dialect as single
// statements, comments removed.
func Schema(dialect Dialect) ([]string, error) {
	var file string
	switch dialect {
	case MySQLDialect:
		file = "schema/mysql.sql"
	case PostgresDialect:
		file = "schema/postgres.sql"
	default:
		return nil, fmt.Errorf("schema: unknown dialect %q", dialect)
	}
	b, err := schemaFiles.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	return splitStatements(string(b)), nil
}

// splitStatements removes -- comments and splits on semicolons: the schema
// files hold no semicolon or "--" inside a string.
func splitStatements(sqlText string) []string {
	var b strings.Builder
	for _, line := range strings.Split(sqlText, "\n") {
		line, _, _ = strings.Cut(line, "--")
		b.WriteString(strings.TrimRight(line, " \t"))
		b.WriteByte('\n')
	}
	var stmts []string
	for _, s := range strings.Split(b.String(), ";") {
		if s = strings.TrimSpace(s); s != "" {
			stmts = append(stmts, s)
		}
	}
	return stmts
}

// CreateCubeMasterSchema creates CubeMaster's job and artifact tables in db,
// which speaks dialect.
func CreateCubeMasterSchema(ctx context.Context, db *sql.DB, dialect Dialect) error {
	stmts, err := Schema(dialect)
	if err != nil {
		return err
	}
	if err := execAll(ctx, db, stmts...); err != nil {
		return fmt.Errorf("create cubemaster schema (%s): %w", dialect, err)
	}
	return nil
}
