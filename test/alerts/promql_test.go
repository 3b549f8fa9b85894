package alerts

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// selector is one vector selector of a PromQL expression: a metric name
// and the text of its label matchers (without braces; empty when none).
type selector struct {
	name, matchers string
}

// promqlKeywords are the identifiers of PromQL that are no metric name
// when they are not followed by a parenthesis: operators, modifiers and
// aggregations (which may be followed by "by (...)" first).
var promqlKeywords = []string{
	"and", "or", "unless", "atan2", "bool", "offset", "inf", "nan",
	"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
	"bottomk", "topk", "quantile", "limitk", "limit_ratio",
}

// labelListKeywords are followed by a parenthesised list of label names.
var labelListKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right"}

// selectors lists the vector selectors of a PromQL expression. It skips
// strings, label matchers, ranges, numbers and durations, function and
// aggregation names and the label lists of by, without, on, ignoring and
// group_*: every identifier left is a metric name. It is not a parser
// (promtool and Prometheus parse the expressions in the other tests); it
// reads the names out so that they can be checked against /metrics.
func selectors(expr string) ([]selector, error) {
	var out []selector
	s := expr
	i := 0
	skipSpace := func(j int) int {
		for j < len(s) && strings.ContainsRune(" \t\r\n", rune(s[j])) {
			j++
		}
		return j
	}
	// closing returns the index after the bracket closing the one at j,
	// skipping quoted strings.
	closing := func(j int) (int, error) {
		open := s[j]
		want := map[byte]byte{'(': ')', '{': '}', '[': ']'}[open]
		depth := 0
		for k := j; k < len(s); k++ {
			switch c := s[k]; {
			case c == '"' || c == '\'' || c == '`':
				end, err := stringEnd(s, k)
				if err != nil {
					return 0, err
				}
				k = end - 1
			case c == open:
				depth++
			case c == want:
				depth--
				if depth == 0 {
					return k + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("unbalanced %q at offset %d in %q", open, j, expr)
	}
	parens := 0
	for i < len(s) {
		c := s[i]
		switch {
		case c == '(':
			parens++
			i++
		case c == ')':
			if parens--; parens < 0 {
				return nil, fmt.Errorf("unbalanced ')' at offset %d in %q", i, expr)
			}
			i++
		case c == '"' || c == '\'' || c == '`':
			end, err := stringEnd(s, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '{' || c == '[':
			// Matchers not after a name ({__name__=...}) or a range.
			end, err := closing(i)
			if err != nil {
				return nil, err
			}
			i = end
		case c >= '0' && c <= '9' || c == '.':
			for i < len(s) && (isIdent(s[i]) || s[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			word := s[i:j]
			next := skipSpace(j)
			switch {
			case slices.Contains(labelListKeywords, word):
				if next < len(s) && s[next] == '(' {
					end, err := closing(next)
					if err != nil {
						return nil, err
					}
					j = end
				}
			case next < len(s) && s[next] == '(':
				// A function or an aggregation.
			case slices.Contains(promqlKeywords, strings.ToLower(word)):
			default:
				sel := selector{name: word}
				if next < len(s) && s[next] == '{' {
					end, err := closing(next)
					if err != nil {
						return nil, err
					}
					sel.matchers = strings.TrimSpace(s[next+1 : end-1])
					j = end
				}
				out = append(out, sel)
			}
			i = j
		default:
			i++
		}
	}
	if parens != 0 {
		return nil, fmt.Errorf("unbalanced '(' in %q", expr)
	}
	return out, nil
}

// stringEnd returns the index after the string literal starting at i.
func stringEnd(s string, i int) (int, error) {
	q := s[i]
	for k := i + 1; k < len(s); k++ {
		switch {
		case s[k] == '\\' && q != '`':
			k++
		case s[k] == q:
			return k + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at offset %d in %q", i, s)
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdent(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }

func TestSelectors(t *testing.T) {
	for _, tc := range []struct {
		name, expr string
		want       []selector
	}{
		{"Bare", "up", []selector{{name: "up"}}},
		{"Comparison", `up{job="cube-templatecenter"} == 0`, []selector{{"up", `job="cube-templatecenter"`}}},
		{"Function", `absent(up{job="x"})`, []selector{{"up", `job="x"`}}},
		{"AggregationBy", `sum by (job, instance) (rate(a_total{x="}"}[5m])) > 0`, []selector{{"a_total", `x="}"`}}},
		{"AggregationAfter", `sum(rate(a_total[5m])) by (result) * 60`, []selector{{name: "a_total"}}},
		{"Without", `sum without (outcome, kind) (increase(b_total{outcome="retry"}[5m]))`, []selector{{"b_total", `outcome="retry"`}}},
		{"SetOperators", "(a and b unless c) > 0 or d", []selector{{name: "a"}, {name: "b"}, {name: "c"}, {name: "d"}}},
		{"VectorMatching", "a / on (job) group_left (version) b", []selector{{name: "a"}, {name: "b"}}},
		{"Histogram", `histogram_quantile(0.95, sum without (result) (rate(t_bucket{result="built"}[1h]))) > 1800`,
			[]selector{{"t_bucket", `result="built"`}}},
		{"NumbersAndDurations", `deriv(free[6h]) * 1e+06 offset 5m < 14400`, []selector{{name: "free"}}},
		{"Unary", "(a - b > 0) / -deriv(a[6h])", []selector{{name: "a"}, {name: "b"}, {name: "a"}}},
		{"GrafanaVariables", `rate(c{instance=~"$instance"}[$__rate_interval])`, []selector{{"c", `instance=~"$instance"`}}},
		{"Bool", "a > bool 1", []selector{{name: "a"}}},
		{"ScalarOnly", "vector(0)", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := selectors(tc.expr)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("selectors(%q) = %q, want %q", tc.expr, got, tc.want)
			}
		})
	}
	for _, bad := range []string{`a{x="y"`, `rate(a[5m]`, "rate(a[5m]))", `a{x="y}`} {
		if _, err := selectors(bad); err == nil {
			t.Errorf("selectors(%q): no error", bad)
		}
	}
}
