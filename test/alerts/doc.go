// Package alerts tests what operators get next to the metrics: the
// Prometheus alert rules (packaging/prometheus). The real promtool checks
// and unit-tests every alert, and the documentation lists each with its
// threshold and runbook. The tests need Debian's prometheus package (make
// deps).
package alerts
