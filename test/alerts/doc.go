// Package alerts tests what operators get next to the metrics: the
// Prometheus alert rules (packaging/prometheus) and the Grafana dashboard
// (packaging/grafana). The real promtool checks and unit-tests every
// alert, the documentation lists each with its threshold and runbook, and
// the dashboard's queries all go through its datasource and instance
// variables. The tests need Debian's prometheus package (make deps).
package alerts
