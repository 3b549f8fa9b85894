package startcheck

import (
	"strconv"
	"strings"
)

// DefaultPath is the PATH an OCI runtime gives a process whose
// environment has none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Effective computes Spec.Argv/Env/WorkingDir/User from the image config and the request's container_overrides with OCI/Kubernetes semantics (see the issue text).
func Effective(entrypoint, cmd, env []string, workingDir, user string, o Overrides) Spec {
	var s Spec
	// Kubernetes: command replaces Entrypoint and, given alone, drops the
	// image Cmd too; args replace Cmd only.
	switch {
	case len(o.Command) > 0:
		s.Argv = append(append([]string{}, o.Command...), o.Args...)
	case len(o.Args) > 0:
		s.Argv = append(append([]string{}, entrypoint...), o.Args...)
	default:
		s.Argv = append(append([]string{}, entrypoint...), cmd...)
	}
	if len(s.Argv) == 0 {
		s.Argv = nil
	}
	s.Env = mergeEnv(env, o.Env)
	s.WorkingDir = "/"
	if o.WorkingDir != "" {
		s.WorkingDir = o.WorkingDir
	} else if workingDir != "" {
		s.WorkingDir = workingDir
	}
	s.User = user
	if o.RunAsUsername != "" {
		s.User = o.RunAsUsername
	} else if o.RunAsUser != nil {
		s.User = strconv.FormatInt(*o.RunAsUser, 10)
	}
	return s
}

// mergeEnv returns base with over on top: a key keeps its first position
// and takes the last value given for it. An image config can hold a
// million variables: the result and the index are sized once, and base
// is not copied first.
func mergeEnv(base, over []string) []string {
	if len(base)+len(over) == 0 {
		return nil
	}
	out := make([]string, 0, len(base)+len(over))
	at := make(map[string]int, len(base)+len(over))
	for _, list := range [][]string{base, over} {
		for _, kv := range list {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := at[k]; ok {
				out[i] = kv
				continue
			}
			at[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// pathOf returns the effective PATH of env: the last PATH entry, or the
// runtime default when there is none.
func pathOf(env []string) string {
	if p, ok := lookupEnv(env, "PATH"); ok {
		return p
	}
	return DefaultPath
}

// lookupEnv returns the value of the last KEY= entry of env.
func lookupEnv(env []string, key string) (string, bool) {
	v, found := "", false
	for _, kv := range env {
		if rest, ok := strings.CutPrefix(kv, key+"="); ok {
			v, found = rest, true
		}
	}
	return v, found
}
