package helmchart

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// helmEnv names the helm binary; the Makefile sets it to the pinned build
// in .tools/bin.
const helmEnv = "TC_HELM"

const (
	chartDir    = "../../packaging/helm/cube-templatecenter"
	toolsHelm   = "../../.tools/bin/helm"
	release     = "tc"
	namespace   = "cube"
	fullname    = "tc-cube-templatecenter"
	installHint = "run `make tools` in the repository root (it installs .tools/bin/helm), or set " + helmEnv
	// kubeVersion is the cluster version helm renders for (.Capabilities):
	// a helm built with go install would assume v1.20.
	kubeVersion = "v1.31.0"
)

// helmBinary finds helm: $TC_HELM, then .tools/bin/helm, then PATH. A
// missing helm fails the test: the chart would otherwise go unchecked.
func helmBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(helmEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v; %s", helmEnv, p, err, installHint)
		}
		return p
	}
	if p, err := filepath.Abs(toolsHelm); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	t.Fatalf("helm not found (%s, %s, PATH); %s", helmEnv, toolsHelm, installHint)
	return ""
}

// helm runs helm with its state directories in a temporary directory, so
// that no repository configuration of the machine's user leaks in.
func helm(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.CommandContext(t.Context(), helmBinary(t), args...)
	cmd.Env = append(os.Environ(),
		"HOME="+home,
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// render runs helm template with the given extra arguments (--values,
// --set) and fails the test when helm does.
func render(t testing.TB, args ...string) *manifests {
	t.Helper()
	out, stderr, err := helm(t, append([]string{"template", release, chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, args...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, stderr)
	}
	m, err := decodeAll(out)
	if err != nil {
		t.Fatalf("helm template %v: %v", args, err)
	}
	return m
}

// serviceMonitor is the part of the Prometheus Operator's
// monitoring.coreos.com/v1 ServiceMonitor the chart renders, with the
// operator's field names: k8s.io/api does not have the type, and the
// operator's module is too large a dependency for one manifest.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// manifests holds the rendered objects by kind.
type manifests struct {
	statefulSets    []*appsv1.StatefulSet
	services        []*corev1.Service
	configMaps      []*corev1.ConfigMap
	serviceAccounts []*corev1.ServiceAccount
	pdbs            []*policyv1.PodDisruptionBudget
	serviceMonitors []*serviceMonitor
	prometheusRules []*prometheusRule
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeAll decodes every document of a helm template output strictly into
// its Kubernetes type: an unknown or misspelt field, a wrong type or an
// unexpected kind is an error.
func decodeAll(out string) (*manifests, error) {
	m := &manifests{}
	for i, doc := range docSeparator.Split(out, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("document %d: read kind: %w", i, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 StatefulSet":
			o := &appsv1.StatefulSet{}
			m.statefulSets, obj = append(m.statefulSets, o), o
		case "v1 Service":
			o := &corev1.Service{}
			m.services, obj = append(m.services, o), o
		case "v1 ConfigMap":
			o := &corev1.ConfigMap{}
			m.configMaps, obj = append(m.configMaps, o), o
		case "v1 ServiceAccount":
			o := &corev1.ServiceAccount{}
			m.serviceAccounts, obj = append(m.serviceAccounts, o), o
		case "policy/v1 PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			m.pdbs, obj = append(m.pdbs, o), o
		case "monitoring.coreos.com/v1 ServiceMonitor":
			o := &serviceMonitor{}
			m.serviceMonitors, obj = append(m.serviceMonitors, o), o
		case "monitoring.coreos.com/v1 PrometheusRule":
			o := &prometheusRule{}
			m.prometheusRules, obj = append(m.prometheusRules, o), o
		default:
			return nil, fmt.Errorf("document %d: unexpected %s %q", i, tm.APIVersion, tm.Kind)
		}
		if err := decodeStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
	}
	return m, nil
}

// decodeStrict decodes one YAML document as the API server does: field
// names match case-sensitively (encoding/json, and so yaml.UnmarshalStrict,
// would take readOnlyRootFileSystem for readOnlyRootFilesystem), and an
// unknown or duplicate field is an error.
func decodeStrict(doc []byte, obj any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := kjson.UnmarshalStrict(j, obj)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// one returns the single element of s, failing the test otherwise.
func one[T any](t testing.TB, what string, s []T) T {
	t.Helper()
	if len(s) != 1 {
		t.Fatalf("rendered %d %s, want 1", len(s), what)
	}
	return s[0]
}

func (m *manifests) service(t testing.TB, name string) *corev1.Service {
	t.Helper()
	for _, s := range m.services {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no Service %q rendered", name)
	return nil
}

// conf parses the rendered conf.yaml.
func (m *manifests) conf(t testing.TB) map[string]any {
	t.Helper()
	cm := one(t, "ConfigMaps", m.configMaps)
	raw, ok := cm.Data["conf.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no conf.yaml: keys %v", cm.Name, cm.Data)
	}
	var c map[string]any
	if err := yaml.UnmarshalStrict([]byte(raw), &c); err != nil {
		t.Fatalf("conf.yaml: %v\n%s", err, raw)
	}
	return c
}

// lookup walks a dotted key through nested maps.
func lookup(c map[string]any, key string) any {
	var v any = c
	for part := range strings.SplitSeq(key, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[part]
	}
	return v
}

func container(t testing.TB, sts *appsv1.StatefulSet) corev1.Container {
	t.Helper()
	return one(t, "containers", sts.Spec.Template.Spec.Containers)
}

func envVar(c corev1.Container, name string) (corev1.EnvVar, bool) {
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 {
		return corev1.EnvVar{}, false
	}
	return c.Env[i], true
}

func mountPath(t testing.TB, c corev1.Container, volume string) string {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		if vm.Name == volume {
			return vm.MountPath
		}
	}
	t.Fatalf("container %s mounts no volume %q: %+v", c.Name, volume, c.VolumeMounts)
	return ""
}

func podVolume(sts *appsv1.StatefulSet, name string) (corev1.Volume, bool) {
	i := slices.IndexFunc(sts.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name })
	if i < 0 {
		return corev1.Volume{}, false
	}
	return sts.Spec.Template.Spec.Volumes[i], true
}

func claimNames(sts *appsv1.StatefulSet) []string {
	var names []string
	for _, c := range sts.Spec.VolumeClaimTemplates {
		names = append(names, c.Name)
	}
	return names
}

func TestLint(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"Defaults", nil},
		{"S3MultiReplica", []string{"--values", "testdata/s3-multi.yaml"}},
		{"Monitoring", []string{"--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, stderr, err := helm(t, append([]string{"lint", "--strict", "--kube-version", kubeVersion, chartDir}, tc.args...)...)
			if err != nil {
				t.Fatalf("helm lint --strict: %v\n%s%s", err, out, stderr)
			}
		})
	}
}

// checkCommon asserts what every rendering must have: probes on the named
// port, the hardened security contexts, the config file mounted and named
// by CUBE_TEMPLATE_CENTER_CONFIG_PATH, the paths conf.yaml names on
// volumes, the shutdown timeout inside the grace period, and the Services.
func checkCommon(t *testing.T, m *manifests) (*appsv1.StatefulSet, corev1.Container, map[string]any) {
	t.Helper()
	sts := one(t, "StatefulSets", m.statefulSets)
	c := container(t, sts)
	pod := sts.Spec.Template.Spec

	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/livez"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Fatalf("%s probe = %+v, want an httpGet", p.name, p.probe)
		}
		if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe = %s on %s, want %s on http", p.name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path)
		}
		if p.probe.TimeoutSeconds < 1 {
			t.Errorf("%s probe timeout %d s", p.name, p.probe.TimeoutSeconds)
		}
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" {
		t.Errorf("container ports = %+v, want one named http", c.Ports)
	}

	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v, want runAsNonRoot and seccomp RuntimeDefault", psc)
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("container has no securityContext")
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Error("container securityContext: runAsNonRoot not true")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("container securityContext: readOnlyRootFilesystem not true")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("container securityContext: allowPrivilegeEscalation not false")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("container capabilities = %+v, want drop [ALL] and no add", sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("container seccompProfile = %+v, want RuntimeDefault", sc.SeccompProfile)
	}

	// The config: the ConfigMap mounted, the variable naming the file in it.
	cm := one(t, "ConfigMaps", m.configMaps)
	cfgVol, ok := podVolume(sts, "config")
	if !ok || cfgVol.ConfigMap == nil || cfgVol.ConfigMap.Name != cm.Name {
		t.Errorf("volume config = %+v, want ConfigMap %s", cfgVol, cm.Name)
	}
	cfgPath, ok := envVar(c, "CUBE_TEMPLATE_CENTER_CONFIG_PATH")
	if want := mountPath(t, c, "config") + "/conf.yaml"; !ok || cfgPath.Value != want {
		t.Errorf("CUBE_TEMPLATE_CENTER_CONFIG_PATH = %+v, want %s", cfgPath, want)
	}
	conf := m.conf(t)

	// Every path TC writes is a volume (the root filesystem is read-only).
	for key, volume := range map[string]string{"store.dir": "store", "store.work_dir": "work"} {
		if got, want := lookup(conf, key), mountPath(t, c, volume); got != want {
			t.Errorf("conf.yaml %s = %v, want the %s volume's mount %s", key, got, volume, want)
		}
	}
	if got, want := lookup(conf, "spool.path"), mountPath(t, c, "spool")+"/spool.db"; got != want {
		t.Errorf("conf.yaml spool.path = %v, want %s", got, want)
	}
	mountPath(t, c, "tmp")
	if got := lookup(conf, "common.http_port"); got != float64(c.Ports[0].ContainerPort) {
		t.Errorf("conf.yaml common.http_port = %v, container port %d", got, c.Ports[0].ContainerPort)
	}
	if got := lookup(conf, "common.http_bind"); got != "0.0.0.0" {
		t.Errorf("conf.yaml common.http_bind = %v, want 0.0.0.0 (the kubelet probes the pod IP)", got)
	}
	if got := lookup(conf, "log.format"); got != "json" {
		t.Errorf("conf.yaml log.format = %v, want json", got)
	}

	// The shutdown ends before Kubernetes kills.
	grace := pod.TerminationGracePeriodSeconds
	if grace == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	var shutdown int64
	if _, err := fmt.Sscanf(fmt.Sprint(lookup(conf, "shutdown.timeout")), "%ds", &shutdown); err != nil || shutdown <= 0 || shutdown >= *grace {
		t.Errorf("conf.yaml shutdown.timeout = %v with terminationGracePeriodSeconds %d: want a shorter positive timeout", lookup(conf, "shutdown.timeout"), *grace)
	}

	// The Services: one CubeMaster calls, one headless governing the pods.
	svc := m.service(t, fullname)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "http" || svc.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("Service %s ports = %+v, want http to the container's http", svc.Name, svc.Spec.Ports)
	}
	headless := m.service(t, sts.Spec.ServiceName)
	if headless.Spec.ClusterIP != corev1.ClusterIPNone || headless.Name == svc.Name {
		t.Errorf("StatefulSet's serviceName %s: clusterIP %q, want a headless Service of its own", headless.Name, headless.Spec.ClusterIP)
	}
	podLabels := sts.Spec.Template.Labels
	for _, s := range []*corev1.Service{svc, headless} {
		for k, v := range s.Spec.Selector {
			if podLabels[k] != v {
				t.Errorf("Service %s selects %s=%s; pods carry %v", s.Name, k, v, podLabels)
			}
		}
	}
	for k, v := range sts.Spec.Selector.MatchLabels {
		if podLabels[k] != v {
			t.Errorf("StatefulSet selector %s=%s; pods carry %v", k, v, podLabels)
		}
	}

	pdb := one(t, "PodDisruptionBudgets", m.pdbs)
	for k, v := range pdb.Spec.Selector.MatchLabels {
		if podLabels[k] != v {
			t.Errorf("PodDisruptionBudget selects %s=%s; pods carry %v", k, v, podLabels)
		}
	}
	if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
		t.Error("PodDisruptionBudget sets neither maxUnavailable nor minAvailable")
	}
	if sa := one(t, "ServiceAccounts", m.serviceAccounts); pod.ServiceAccountName != sa.Name {
		t.Errorf("serviceAccountName %q, ServiceAccount %q", pod.ServiceAccountName, sa.Name)
	}
	return sts, c, conf
}

func TestSingleReplicaDefaults(t *testing.T) {
	m := render(t)
	sts, c, conf := checkCommon(t, m)

	if r := sts.Spec.Replicas; r == nil || *r != 1 {
		t.Errorf("replicas = %v, want 1", r)
	}
	// The spool and the store are claims per replica; the work directory
	// (layer cache) is an emptyDir by default.
	if got, want := claimNames(sts), []string{"spool", "store"}; !slices.Equal(got, want) {
		t.Errorf("volumeClaimTemplates = %v, want %v", got, want)
	}
	if v, ok := podVolume(sts, "work"); !ok || v.EmptyDir == nil {
		t.Errorf("volume work = %+v, want an emptyDir", v)
	}
	for _, vct := range sts.Spec.VolumeClaimTemplates {
		if vct.Spec.Resources.Requests.Storage().IsZero() {
			t.Errorf("claim %s requests no storage", vct.Name)
		}
	}
	if *sts.Spec.Template.Spec.TerminationGracePeriodSeconds != 30 || lookup(conf, "shutdown.timeout") != "25s" {
		t.Errorf("grace %d s, shutdown.timeout %v: want 30 s and 25s", *sts.Spec.Template.Spec.TerminationGracePeriodSeconds, lookup(conf, "shutdown.timeout"))
	}
	if c.StartupProbe != nil {
		t.Errorf("startupProbe = %+v, want none by default", c.StartupProbe)
	}

	aff := sts.Spec.Template.Spec.Affinity
	if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		len(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 0 {
		t.Fatalf("affinity = %+v, want one preferred pod anti-affinity term", aff)
	}
	term := aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
	if term.TopologyKey != "kubernetes.io/hostname" || term.LabelSelector == nil {
		t.Errorf("anti-affinity term = %+v, want kubernetes.io/hostname over the pods' labels", term)
	}
	for k, v := range term.LabelSelector.MatchLabels {
		if sts.Spec.Template.Labels[k] != v {
			t.Errorf("anti-affinity selects %s=%s; pods carry %v", k, v, sts.Spec.Template.Labels)
		}
	}

	for _, e := range c.Env {
		if e.Name != "CUBE_TEMPLATE_CENTER_CONFIG_PATH" {
			t.Errorf("env %s set without any secret or extraEnv configured", e.Name)
		}
	}
	if _, ok := podVolume(sts, "secrets"); ok {
		t.Error("secrets volume rendered with no secret referenced")
	}
	for _, key := range []string{"artifact_store", "instance_db_config", "redis"} {
		if v := lookup(conf, key); v != nil {
			t.Errorf("conf.yaml %s = %v, want unset by default", key, v)
		}
	}
	if len(m.serviceMonitors) != 0 {
		t.Errorf("%d ServiceMonitors rendered, want none by default", len(m.serviceMonitors))
	}
}

// secretVars are the variables the chart feeds from referenced Secrets in
// testdata/s3-multi.yaml, with the Secret and key each comes from.
var secretVars = map[string][2]string{
	"CUBE_TEMPLATE_CALLBACK_TOKEN":        {"cube-callback", "token"},
	"CUBE_S3_ACCESS_KEY_ID":               {"cube-s3", "id"},
	"CUBE_S3_SECRET_ACCESS_KEY":           {"cube-s3", "secret"},
	"CUBE_S3_SESSION_TOKEN":               {"cube-s3", "session"},
	"CUBE_TEMPLATE_CENTER_DB_PASSWORD":    {"cube-db", "password"},
	"CUBE_TEMPLATE_CENTER_REDIS_PASSWORD": {"cube-redis", "password"},
	"CUBE_TEMPLATE_CENTER_RECORD_SECRET":  {"cube-record", "record"},
}

func TestS3MultiReplica(t *testing.T) {
	m := render(t, "--values", "testdata/s3-multi.yaml")
	sts, c, conf := checkCommon(t, m)

	if r := sts.Spec.Replicas; r == nil || *r != 3 {
		t.Errorf("replicas = %v, want 3", r)
	}
	if got, want := claimNames(sts), []string{"spool", "work"}; !slices.Equal(got, want) {
		t.Errorf("volumeClaimTemplates = %v, want %v (store on an emptyDir, work on a claim)", got, want)
	}
	for _, vct := range sts.Spec.VolumeClaimTemplates {
		if vct.Name == "work" && (vct.Spec.StorageClassName == nil || *vct.Spec.StorageClassName != "fast" || vct.Spec.Resources.Requests.Storage().String() != "100Gi") {
			t.Errorf("claim work = %+v, want 100Gi of class fast", vct.Spec)
		}
	}
	if v, ok := podVolume(sts, "store"); !ok || v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.String() != "20Gi" {
		t.Errorf("volume store = %+v, want an emptyDir of 20Gi", v)
	}
	aff := sts.Spec.Template.Spec.Affinity
	if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("affinity = %+v, want one required pod anti-affinity term", aff)
	}
	if tk := aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey; tk != "kubernetes.io/hostname" {
		t.Errorf("anti-affinity topologyKey = %q", tk)
	}
	if c.StartupProbe == nil || c.StartupProbe.HTTPGet == nil || c.StartupProbe.HTTPGet.Path != "/livez" {
		t.Errorf("startupProbe = %+v, want /livez", c.StartupProbe)
	}

	for key, want := range map[string]any{
		"artifact_store.backend":           "s3",
		"artifact_store.s3.endpoint":       "http://minio.cube.svc:9000",
		"artifact_store.s3.bucket":         "cube-templates",
		"artifact_store.s3.use_path_style": true,
		"artifact_store.s3.prefix":         "templates",
		"instance_db_config.driver":        "mysql",
		"instance_db_config.addr":          "mysql.cube.svc:3306",
		"instance_db_config.db_name":       "cube_mvp",
		"master.addr":                      "http://cubemaster.cube.svc:8089",
		"build.max_concurrent_builds":      float64(4),
		"log.level":                        "info",
	} {
		if got := lookup(conf, key); got != want {
			t.Errorf("conf.yaml %s = %#v, want %#v", key, got, want)
		}
	}
	// Secrets never reach the ConfigMap.
	for _, key := range []string{"instance_db_config.pwd", "redis.password", "artifact_store.s3.secret_access_key", "artifact_store.record_secret"} {
		if v := lookup(conf, key); v != nil {
			t.Errorf("conf.yaml holds %s", key)
		}
	}

	t.Run("SecretsAsFiles", func(t *testing.T) {
		vol, ok := podVolume(sts, "secrets")
		if !ok || vol.Projected == nil {
			t.Fatalf("volume secrets = %+v, want a projected volume", vol)
		}
		if m := vol.Projected.DefaultMode; m == nil || *m != 0o440 {
			t.Errorf("secrets defaultMode = %v, want 0440 (owner and group read)", m)
		}
		dir := mountPath(t, c, "secrets")
		files := map[string][2]string{}
		for _, src := range vol.Projected.Sources {
			if src.Secret == nil {
				t.Fatalf("projected source %+v is not a Secret", src)
			}
			for _, it := range src.Secret.Items {
				files[it.Path] = [2]string{src.Secret.Name, it.Key}
			}
		}
		for name, ref := range secretVars {
			if files[name] != ref {
				t.Errorf("secret file %s from %v, want %v", name, files[name], ref)
			}
			if e, ok := envVar(c, name+"_FILE"); !ok || e.Value != dir+"/"+name {
				t.Errorf("%s_FILE = %+v, want %s/%s", name, e, dir, name)
			}
			if _, ok := envVar(c, name); ok {
				t.Errorf("%s set directly as well as through its file", name)
			}
		}
		if len(files) != len(secretVars) {
			t.Errorf("secret files %v, want %d", files, len(secretVars))
		}
	})

	t.Run("SecretsAsEnv", func(t *testing.T) {
		m := render(t, "--values", "testdata/s3-multi.yaml", "--set", "secrets.mount=env")
		sts, c, _ := checkCommon(t, m)
		if _, ok := podVolume(sts, "secrets"); ok {
			t.Error("secrets volume rendered with secrets.mount=env")
		}
		for name, ref := range secretVars {
			e, ok := envVar(c, name)
			if !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
				e.ValueFrom.SecretKeyRef.Name != ref[0] || e.ValueFrom.SecretKeyRef.Key != ref[1] {
				t.Errorf("env %s = %+v, want secretKeyRef %v", name, e, ref)
			}
		}
	})
}

func TestSharedFSMultiReplica(t *testing.T) {
	m := render(t, "--set", "replicaCount=2", "--set", "artifactStore.backend=fs",
		"--set", "artifactStore.fs.existingClaim=cube-blobs",
		"--set", "database.driver=postgres", "--set", "database.addr=pg:5432", "--set", "database.user=cube", "--set", "database.dbName=cube")
	sts, c, conf := checkCommon(t, m)
	v, ok := podVolume(sts, "blobs")
	if !ok || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "cube-blobs" {
		t.Fatalf("volume blobs = %+v, want claim cube-blobs", v)
	}
	if got := lookup(conf, "artifact_store.fs_root"); got != mountPath(t, c, "blobs") {
		t.Errorf("conf.yaml artifact_store.fs_root = %v, mount %s", got, mountPath(t, c, "blobs"))
	}
}

// TestStoreOnCubeMastersClaim: one replica without a blob store writes
// into CubeMaster's artifact claim, at CubeMaster's path, since TC reports
// artifacts by path.
func TestStoreOnCubeMastersClaim(t *testing.T) {
	m := render(t, "--set", "persistence.store.type=existingClaim", "--set", "persistence.store.existingClaim=cubemaster-artifacts")
	sts, c, conf := checkCommon(t, m)
	v, ok := podVolume(sts, "store")
	if !ok || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "cubemaster-artifacts" {
		t.Fatalf("volume store = %+v, want claim cubemaster-artifacts", v)
	}
	if got, want := claimNames(sts), []string{"spool"}; !slices.Equal(got, want) {
		t.Errorf("volumeClaimTemplates = %v, want %v", got, want)
	}
	if got := mountPath(t, c, "store"); got != "/data/CubeMaster/storage" || lookup(conf, "store.dir") != got {
		t.Errorf("store mounted at %s, store.dir %v: want CubeMaster's /data/CubeMaster/storage", got, lookup(conf, "store.dir"))
	}
}

// TestInvalid checks that helm refuses values that cannot work, with the
// chart's message.
func TestInvalid(t *testing.T) {
	db := []string{"--set", "database.driver=mysql", "--set", "database.addr=db:3306", "--set", "database.user=u", "--set", "database.dbName=d"}
	s3 := []string{"--set", "artifactStore.backend=s3", "--set", "artifactStore.s3.endpoint=http://s3:9000", "--set", "artifactStore.s3.bucket=b"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"TwoReplicasWithoutS3", []string{"--set", "replicaCount=2"}, "replicaCount 2 needs a shared blob store"},
		{"TwoReplicasWithoutS3WithDatabase", append([]string{"--set", "replicaCount=2"}, db...), "replicaCount 2 needs a shared blob store"},
		{"FSWithoutSharedClaim", append([]string{"--set", "replicaCount=2", "--set", "artifactStore.backend=fs"}, db...), "replicaCount 2 needs a shared blob store"},
		{"FSClaimNotReadWriteMany", append([]string{"--set", "replicaCount=2", "--set", "artifactStore.backend=fs",
			"--set", "artifactStore.fs.existingClaim=c", "--set", "artifactStore.fs.accessModes={ReadWriteOnce}"}, db...), "replicaCount 2 needs a shared blob store"},
		{"ThreeReplicasWithoutDatabase", append([]string{"--set", "replicaCount=3"}, s3...), "replicaCount 3 needs CubeMaster's database"},
		{"S3WithoutBucket", []string{"--set", "artifactStore.backend=s3", "--set", "artifactStore.s3.endpoint=http://s3:9000"}, "artifactStore.backend s3 needs artifactStore.s3.endpoint and artifactStore.s3.bucket"},
		{"SharedStoreClaimTwoReplicas", append(append([]string{"--set", "replicaCount=2", "--set", "persistence.store.type=existingClaim",
			"--set", "persistence.store.existingClaim=c"}, s3...), db...), "each replica needs a store of its own"},
		{"StoreClaimWithoutName", []string{"--set", "persistence.store.type=existingClaim"}, "needs persistence.store.existingClaim"},
		{"DatabaseWithoutUser", []string{"--set", "database.driver=mysql", "--set", "database.addr=db:3306", "--set", "database.dbName=d"}, "database.user and database.dbName are needed"},
		{"GraceBelowMargin", []string{"--set", "terminationGracePeriodSeconds=5"}, "terminationGracePeriodSeconds 5 must exceed shutdownMarginSeconds 5"},
		{"UnknownBackend", []string{"--set", "artifactStore.backend=gcs"}, "/artifactStore/backend"},
		{"UnknownValue", []string{"--set", "replicaCont=2"}, "replicaCont"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, stderr, err := helm(t, append([]string{"template", release, chartDir, "--kube-version", kubeVersion}, tc.args...)...)
			if err == nil {
				t.Fatalf("helm template %v succeeded, want an error containing %q\n%s", tc.args, tc.want, out)
			}
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) {
				t.Fatalf("helm template: %v", err)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("helm template %v: stderr %q, want it to contain %q", tc.args, stderr, tc.want)
			}
		})
	}
}

func TestServiceMonitor(t *testing.T) {
	m := render(t, "--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.labels.release=prometheus")
	sm := one(t, "ServiceMonitors", m.serviceMonitors)
	if sm.Labels["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels = %v, want release=prometheus", sm.Labels)
	}
	ep := one(t, "ServiceMonitor endpoints", sm.Spec.Endpoints)
	if ep.Port != "http" || ep.Path != "/metrics" || ep.Interval == "" {
		t.Errorf("endpoint = %+v, want /metrics on http with an interval", ep)
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("namespaceSelector = %+v, want %s", sm.Spec.NamespaceSelector, namespace)
	}
	// It selects the Service CubeMaster calls, not the headless one too,
	// which would scrape every pod twice.
	sel, err := metav1.LabelSelectorAsMap(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	var selected []string
	for _, s := range m.services {
		if matches(sel, s.Labels) {
			selected = append(selected, s.Name)
		}
	}
	if !slices.Equal(selected, []string{fullname}) {
		t.Errorf("ServiceMonitor selects Services %v, want [%s]", selected, fullname)
	}
}

func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestStrictDecoding proves the decoding catches what a cluster would
// reject: a rendered manifest with one field misspelt must fail.
func TestStrictDecoding(t *testing.T) {
	out, stderr, err := helm(t, "template", release, chartDir, "--kube-version", kubeVersion, "--show-only", "templates/statefulset.yaml")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	if _, err := decodeAll(out); err != nil {
		t.Fatalf("the rendered StatefulSet does not decode: %v", err)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"PodSpecField", "terminationGracePeriodSeconds:", "terminationGracePeriodSecond:", "terminationGracePeriodSecond"},
		{"ContainerField", "readinessProbe:", "readinesProbe:", "readinesProbe"},
		{"NestedField", "readOnlyRootFilesystem:", "readOnlyRootFileSystem:", "readOnlyRootFileSystem"},
		{"ProbeField", "path: /livez", "pth: /livez", "pth"},
		{"DuplicateField", "podManagementPolicy: Parallel", "podManagementPolicy: Parallel\n  podManagementPolicy: OrderedReady", "podManagementPolicy"},
		{"WrongType", "replicas: 1", "replicas: one", "replicas"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(out, tc.from, tc.to, 1)
			if bad == out {
				t.Fatalf("rendered StatefulSet has no %q to change", tc.from)
			}
			_, err := decodeAll(bad)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decode with %q: error %v, want one naming %q", tc.to, err, tc.want)
			}
		})
	}
	t.Run("UnknownKind", func(t *testing.T) {
		if _, err := decodeAll("apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n"); err == nil {
			t.Error("a Secret decoded: the chart must not create Secrets")
		}
	})
}

// TestConfigAccepted feeds each rendered conf.yaml, and the environment the
// pod gets, to TC's own configuration loader in strict mode (unknown keys
// fatal): the chart's keys must be the ones TC reads, and its secret
// variables must reach the configuration.
func TestConfigAccepted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		secrets bool // every variable of secretVars reaches the configuration
	}{
		{"Defaults", nil, false},
		{"S3MultiReplica", []string{"--values", "testdata/s3-multi.yaml"}, true},
		{"S3MultiReplicaSecretsAsEnv", []string{"--values", "testdata/s3-multi.yaml", "--set", "secrets.mount=env"}, true},
		{"SharedFS", []string{"--set", "replicaCount=2", "--set", "artifactStore.backend=fs", "--set", "artifactStore.fs.existingClaim=b",
			"--set", "database.driver=postgres", "--set", "database.addr=pg:5432", "--set", "database.user=cube", "--set", "database.dbName=cube",
			"--set", "database.sslmode=verify-full"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := render(t, tc.args...)
			sts := one(t, "StatefulSets", m.statefulSets)
			c := container(t, sts)
			dir := t.TempDir()
			confPath := filepath.Join(dir, "conf.yaml")
			if err := os.WriteFile(confPath, []byte(one(t, "ConfigMaps", m.configMaps).Data["conf.yaml"]), 0o640); err != nil {
				t.Fatal(err)
			}
			// The pod's environment, with the mounted paths moved into dir:
			// each secret's value is its variable's name, in a file or not.
			env := map[string]string{}
			want := map[string]string{}
			for _, e := range c.Env {
				switch {
				case e.Name == config.PathEnv:
					env[e.Name] = confPath
				case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
					env[e.Name] = "value-of-" + e.Name
					want[e.Name] = env[e.Name]
				case strings.HasSuffix(e.Name, "_FILE"):
					name := strings.TrimSuffix(e.Name, "_FILE")
					f := filepath.Join(dir, filepath.Base(e.Value))
					if err := os.WriteFile(f, []byte("value-of-"+name+"\n"), 0o440); err != nil {
						t.Fatal(err)
					}
					env[e.Name] = f
					want[name] = "value-of-" + name
				default:
					env[e.Name] = e.Value
				}
			}
			cfg, rep, err := config.Read(func(k string) (string, bool) { v, ok := env[k]; return v, ok }, config.Options{Strict: true})
			if err != nil {
				t.Fatalf("config.Read of the rendered conf.yaml: %v", err)
			}
			for _, w := range rep.Warnings {
				t.Logf("config warning: %s", w.Text)
			}
			if cfg.Shutdown.Timeout != 25*time.Second || cfg.Log.Format != "json" || cfg.Common.HTTPPort != int(c.Ports[0].ContainerPort) {
				t.Errorf("shutdown.timeout %v, log.format %q, http_port %d: want 25s, json, %d",
					cfg.Shutdown.Timeout, cfg.Log.Format, cfg.Common.HTTPPort, c.Ports[0].ContainerPort)
			}
			got := map[string]string{
				"CUBE_TEMPLATE_CALLBACK_TOKEN":        cfg.Master.Token,
				"CUBE_S3_ACCESS_KEY_ID":               cfg.ArtifactStore.S3.AccessKeyID,
				"CUBE_S3_SECRET_ACCESS_KEY":           cfg.ArtifactStore.S3.SecretAccessKey.Reveal(),
				"CUBE_S3_SESSION_TOKEN":               cfg.ArtifactStore.S3.SessionToken.Reveal(),
				"CUBE_TEMPLATE_CENTER_DB_PASSWORD":    cfg.InstanceDB.Pwd.Reveal(),
				"CUBE_TEMPLATE_CENTER_REDIS_PASSWORD": cfg.Redis.Password.Reveal(),
				"CUBE_TEMPLATE_CENTER_RECORD_SECRET":  cfg.ArtifactStore.RecordSecret.Reveal(),
			}
			if tc.secrets && len(want) != len(secretVars) {
				t.Errorf("the pod's environment feeds %d secrets (%v), want the %d of secretVars", len(want), want, len(secretVars))
			}
			for name, v := range got {
				if v != want[name] {
					t.Errorf("configuration's %s = %q, want %q", name, v, want[name])
				}
			}
		})
	}
}
