{{/* Labels every object of the chart carries besides its own (the test comparing the chart with
config/default leaves these out). */}}
{{- define "renderqueue.chartLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels of the operator's objects (config/rbac, config/manager). */}}
{{- define "renderqueue.operatorLabels" -}}
app.kubernetes.io/component: operator
app.kubernetes.io/name: renderqueue
{{ include "renderqueue.chartLabels" . }}
{{- end }}

{{/* The labels of the metrics API's objects (config/metrics-api). */}}
{{- define "renderqueue.metricsAPILabels" -}}
app.kubernetes.io/component: metrics-api
app.kubernetes.io/name: renderqueue-operator
{{ include "renderqueue.chartLabels" . }}
{{- end }}

{{/* The operator Pods' selector. */}}
{{- define "renderqueue.selector" -}}
app.kubernetes.io/component: operator
app.kubernetes.io/name: renderqueue
{{- end }}

{{/* The image: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "renderqueue.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The operator's ServiceAccount as a binding subject. */}}
{{- define "renderqueue.subject" -}}
- kind: ServiceAccount
  name: renderqueue-operator
  namespace: {{ .Release.Namespace }}
{{- end }}
