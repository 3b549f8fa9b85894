// Package inject adds the build's own files to a flattened image: the envd
// binary and the CubeEgress root CA, following upstream's placement rules.
package inject
