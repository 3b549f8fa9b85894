// Package helmchart tests the Helm chart in packaging/helm/cube-templatecenter:
// helm lints and renders it, and every rendered manifest is decoded strictly
// into the Kubernetes API types, so a misspelt field fails the test. No
// cluster is needed. The Kubernetes modules are imported by the tests only.
package helmchart
