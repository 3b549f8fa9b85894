package jobs

import (
	"fmt"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// startCheckResults are the start check's results, the metric's labels.
var startCheckResults = []string{"ok", "warnings", "no_command", "failed"}

// startOverrides maps a request's container_overrides to what the start
// check reads of them.
func startOverrides(o *api.ContainerOverrides) rootfs.StartOverrides {
	if o == nil {
		return rootfs.StartOverrides{}
	}
	out := rootfs.StartOverrides{Command: o.Command, Args: o.Args, WorkingDir: o.WorkingDir}
	for _, kv := range o.Envs {
		if kv != nil && kv.Key != "" {
			out.Env = append(out.Env, kv.Key+"="+kv.Value)
		}
	}
	if sc := o.SecurityContext; sc != nil {
		out.RunAsUsername = sc.RunAsUsername
		if sc.RunAsUser != nil {
			uid := sc.RunAsUser.Value
			out.RunAsUser = &uid
		}
	}
	return out
}

// checkReused fails a job that would report an artifact whose recorded
// start check failed while the check fails builds: the artifact was
// built (or recorded) when build.start_check was warn, and the fingerprint
// does not cover the mode.
func (e *Executor) checkReused(built *api.Built) error {
	c := built.TemplateCheck
	if mode := e.settings().StartCheck; c == nil || c.Result != "failed" || (mode != "" && mode != config.StartCheckFail) {
		return nil
	}
	msg := c.Result
	if len(c.Problems) > 0 {
		msg = c.Problems[0]
	}
	return fmt.Errorf("template start check: %s", msg)
}
