// Package alerts tests what operators get next to the metrics: the
// Prometheus alert rules (packaging/prometheus) and the Grafana dashboard
// (packaging/grafana). The real promtool checks and unit-tests every
// alert; every metric the rules and panels read must be one a running
// agent exports; a real Prometheus scraping a real agent, with the rules
// loaded, must fire the report backlog alert and accept every panel's
// query. The tests need Debian's prometheus package (make deps).
package alerts
