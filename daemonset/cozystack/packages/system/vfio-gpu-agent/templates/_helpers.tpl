{{/*
Object names are fixed, not derived from the release name: the ClusterRole grants `get` on the admission
policy by name, the policy names the ServiceAccount inside CEL, and two agents on one node would register the
same resource names. One release per cluster.
*/}}

{{- define "vfio-gpu-agent.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/*
Every object's labels. The lines after the first are Helm's own; scripts/render-manifests.sh drops exactly
these four lines from the kustomize output, so keep them one per line and in this form.
*/}}
{{- define "vfio-gpu-agent.labels" -}}
app.kubernetes.io/name: vfio-gpu-agent
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/*
"true" when the agent may serve vGPUs: workloadMode vm-vgpu, or label (the node label picks the mode, and can
turn the node vm-vgpu while the agent runs). Such an agent gets the state directory, the profiles ConfigMap and
`patch` on nodes for nvidia.com/vgpu.config.state.
*/}}
{{- define "vfio-gpu-agent.vgpu" -}}
{{- if has .Values.workloadMode (list "vm-vgpu" "label") }}true{{ end -}}
{{- end -}}

{{- define "vfio-gpu-agent.serviceAccountUser" -}}
system:serviceaccount:{{ include "vfio-gpu-agent.namespace" . }}:vfio-gpu-agent
{{- end -}}

{{/*
The agent keeps state across restarts (--state-dir on a hostPath) when it may serve vGPUs (the SR-IOV type names
a full card no longer lists) or runs in shared-NVSwitch mode (Fabric Manager's partition table, told to a restarted
FM before it answers a read).
*/}}
{{- define "vfio-gpu-agent.stateDir" -}}
{{- if or (include "vfio-gpu-agent.vgpu" .) .Values.fabricManager.address }}true{{ end -}}
{{- end }}
