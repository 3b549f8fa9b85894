package cubemaster

import "maps"

// DownloadBaseURL is the download_base_url BuildRequest puts in a request:
// CubeMaster's address as the agent reports it back (master_node_ip).
const DownloadBaseURL = "127.0.0.1:8089"

// BuildRequest returns a valid body for the agent's POST /tc/api/v1/build
// as CubeMaster sends it, a JSON object for job jobID of image: the
// template request names requestID "req-<jobID>" and template_id
// "tpl-<jobID>", a 1Gi writable layer, instance type cubebox and network
// type tap. template holds more fields of the template request, or ones
// to change (nil for none); callers change the top-level fields (such as
// download_base_url or envd_data) in the map returned.
func BuildRequest(jobID, image string, template map[string]any) map[string]any {
	req := map[string]any{
		"requestID":           "req-" + jobID,
		"template_id":         "tpl-" + jobID,
		"source_image_ref":    image,
		"writable_layer_size": "1Gi",
		"instance_type":       "cubebox",
		"network_type":        "tap",
	}
	maps.Copy(req, template)
	return map[string]any{
		"job_id":            jobID,
		"download_base_url": DownloadBaseURL,
		"request":           req,
	}
}
