package api

// The types below mirror CubeMaster's CreateTemplateFromImageReq.
// container_overrides field for field (order, JSON names, omitempty and
// pointer-ness), because the template fingerprint is the SHA-256 of its Go
// JSON encoding: any difference here changes every fingerprint.

// ContainerOverrides is the container_overrides object of a template request.
type ContainerOverrides struct {
	Command         []string                  `json:"command,omitempty"`
	Args            []string                  `json:"args,omitempty"`
	WorkingDir      string                    `json:"working_dir,omitempty"`
	Envs            []*KeyValue               `json:"envs,omitempty"`
	DNSConfig       *DNSConfig                `json:"dns_config,omitempty"`
	Resources       *Resource                 `json:"resources,omitempty"`
	SecurityContext *ContainerSecurityContext `json:"security_context,omitempty"`
	Probe           *Probe                    `json:"probe,omitempty"`
	Annotations     map[string]string         `json:"annotations,omitempty"`
	VolumeMounts    []*VolumeMounts           `json:"volume_mounts,omitempty"`
	RLimit          *RLimit                   `json:"r_limit,omitempty"`
}

// KeyValue is one environment variable.
type KeyValue struct {
	Key   string `json:"key,omitempty"`
	Value string `json:"value,omitempty"`
}

// DNSConfig is the guest resolver configuration.
type DNSConfig struct {
	Servers  []string `json:"servers,omitempty"`
	Searches []string `json:"searches,omitempty"`
	Options  []string `json:"options,omitempty"`
}

// Resource is a CPU and memory request with an optional limit.
type Resource struct {
	CPU   string        `json:"cpu,omitempty"`
	Mem   string        `json:"mem,omitempty"`
	Limit *RequestLimit `json:"limit,omitempty"`
}

// RequestLimit is the limit part of a Resource.
type RequestLimit struct {
	CPU string `json:"cpu,omitempty"`
	Mem string `json:"mem,omitempty"`
}

// ContainerSecurityContext is the container's Linux security settings.
type ContainerSecurityContext struct {
	Capabilities   *Capability `json:"capabilities,omitempty"`
	Privileged     bool        `json:"privileged,omitempty"`
	RunAsUser      *Int64Value `json:"run_as_user,omitempty"`
	NoNewPrivs     bool        `json:"no_new_privs,omitempty"`
	RunAsGroup     *Int64Value `json:"run_as_group,omitempty"`
	RunAsUsername  string      `json:"run_as_username,omitempty"`
	ReadonlyRootfs bool        `json:"readonly_rootfs,omitempty"`
}

// Int64Value wraps an optional integer.
type Int64Value struct {
	Value int64 `json:"value,omitempty"`
}

// Capability lists capabilities to add and drop.
type Capability struct {
	AddCapabilities        []string `json:"add_capabilities,omitempty"`
	DropCapabilities       []string `json:"drop_capabilities,omitempty"`
	AddAmbientCapabilities []string `json:"add_ambient_capabilities,omitempty"`
}

// Probe is a readiness check of the sandboxed process.
type Probe struct {
	ProbeHandler        *ProbeHandler `json:"probe_handler,omitempty"`
	InitialDelaySeconds int32         `json:"initial_delay_seconds,omitempty"`
	TimeoutSeconds      int32         `json:"timeout_seconds,omitempty"`
	InitialDelayMs      int32         `json:"initial_delay_ms,omitempty"`
	TimeoutMs           int32         `json:"timeout_ms,omitempty"`
	PeriodMs            int32         `json:"period_ms,omitempty"`
	SuccessThreshold    int32         `json:"success_threshold,omitempty"`
	FailureThreshold    int32         `json:"failure_threshold,omitempty"`
	ProbeTimeoutMs      int32         `json:"probe_timeout_ms,omitempty"`
}

// ProbeHandler selects how a Probe checks.
type ProbeHandler struct {
	TCPSocket *TCPSocketAction `json:"tcp_socket,omitempty"`
	Ping      *PingAction      `json:"ping,omitempty"`
	HTTPGet   *HTTPGetAction   `json:"http_get,omitempty"`
}

// HTTPGetAction probes with an HTTP GET.
type HTTPGetAction struct {
	Path        *string       `json:"path,omitempty"`
	Port        int32         `json:"port,omitempty"`
	Host        *string       `json:"host,omitempty"`
	HTTPHeaders []*HTTPHeader `json:"http_headers,omitempty"`
}

// HTTPHeader is one header of an HTTP probe.
type HTTPHeader struct {
	Name  *string `json:"name,omitempty"`
	Value *string `json:"value,omitempty"`
}

// TCPSocketAction probes by opening a TCP connection.
type TCPSocketAction struct {
	Port int32  `json:"port,omitempty"`
	Host string `json:"host,omitempty"`
}

// PingAction probes with a ping.
type PingAction struct {
	UDP bool `json:"udp,omitempty"`
}

// RLimit holds process resource limits.
type RLimit struct {
	NoFile uint64 `json:"no_file,omitempty"`
}

// VolumeMounts is one mount of the container, in the protobuf-generated
// shape CubeMaster uses (declaration order, JSON names as in the .proto).
type VolumeMounts struct {
	Name              string       `json:"name,omitempty"`
	ContainerPath     string       `json:"container_path,omitempty"`
	Readonly          bool         `json:"readonly,omitempty"`
	Propagation       int32        `json:"propagation,omitempty"`
	UID               string       `json:"uid,omitempty"`
	GID               string       `json:"gid,omitempty"`
	Exec              bool         `json:"exec,omitempty"`
	HostPath          string       `json:"host_path,omitempty"`
	UIDMappings       []*IDMapping `json:"uidMappings,omitempty"`
	GIDMappings       []*IDMapping `json:"gidMappings,omitempty"`
	RecursiveReadOnly bool         `json:"recursive_read_only,omitempty"`
	SelinuxRelabel    bool         `json:"selinux_relabel,omitempty"`
	SubPath           string       `json:"sub_path,omitempty"`
}

// IDMapping maps a range of user or group ids for a mount.
type IDMapping struct {
	HostID      uint32 `json:"host_id,omitempty"`
	ContainerID uint32 `json:"container_id,omitempty"`
	Length      uint32 `json:"length,omitempty"`
}
