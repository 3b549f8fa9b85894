package main

import (
	"os"
	"testing"
)

// TestStartupLogNamesGzipInflater checks that the agent's startup line
// names the gzip inflater: Go when forced by the environment, ISA-L by
// default where libisal is expected (make test sets TC_EXPECT_ISAL=1).
func TestStartupLogNamesGzipInflater(t *testing.T) {
	cm := startCubeMaster(t, testToken)
	tests := []struct {
		name string
		env  []string
		want []string
	}{
		{"Forced", []string{"CUBE_TEMPLATE_CENTER_INFLATE=go"}, []string{"gzip_inflate=go", `gzip_inflate_reason="CUBE_TEMPLATE_CENTER_INFLATE=go"`}},
	}
	if os.Getenv("TC_EXPECT_ISAL") == "1" {
		tests = append(tests, struct {
			name string
			env  []string
			want []string
		}{"Default", nil, []string{"gzip_inflate=isal"}})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, cm.URL(), testToken)
			p := h.startAgent("agent", tc.env...)
			p.waitLine(t, append([]string{"msg=templatecenter"}, tc.want...)...)
		})
	}
}
