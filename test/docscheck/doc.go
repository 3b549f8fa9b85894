// Package docscheck keeps the documentation and the binary in step. Its
// test builds templatecenter, starts it with every optional part, and
// compares what it serves (/metrics, and the route each request is counted
// under), prints (check-config --json) and lists (-h) with the metrics,
// routes, configuration keys and defaults, environment variables, commands
// and flags that README.md, docs/*.md, the man page, the packaged conf.yaml
// and the Helm chart's values name, both ways: everything documented
// exists, and every metric served, key printed, command listed and flag it
// takes is documented (routes one way only: the binary does not list
// them). The extraction rules and the few deliberate exceptions are at the
// top of extract_test.go and compare_test.go. It imports nothing of the
// module: the binary is what it checks.
package docscheck
