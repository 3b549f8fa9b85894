// Package masterdb is CubeMaster's database as TC sees it: the connection to
// the MySQL or PostgreSQL database CubeMaster owns, and the few reads and
// writes TC makes of its rows. CubeMaster creates the schema and runs its
// migrations; this package never changes it. It takes plain Options and
// imports no other package of the project.
package masterdb
