{{/* The objects' name: the release name, unless it lacks the chart's name. */}}
{{- define "npagent.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "npagent.serviceAccountName" -}}
{{- default (include "npagent.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "npagent.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "npagent.labels" -}}
{{ include "npagent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* repository@digest when a digest is given, else repository:tag (tag defaults to appVersion). */}}
{{- define "npagent.image" -}}
{{- with .Values.image -}}
{{- if .digest -}}
{{- if not (regexMatch "^sha256:[a-f0-9]{64}$" .digest) -}}
{{- fail (printf "image.digest %q: want sha256: and 64 lowercase hex digits" .digest) -}}
{{- end -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository (default $.Chart.AppVersion .tag) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The bytes of a memory quantity written as an integer with an optional binary (Ki..Ti)
or decimal (k..T) suffix; anything else fails the render, naming the value.
*/}}
{{- define "npagent.memoryBytes" -}}
{{- $q := toString . -}}
{{- $m := regexFindAll "^([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$" $q 1 -}}
{{- if not $m -}}
{{- fail (printf "resources.limits.memory %q: goMemLimitPercent below 100 needs an integer with an optional suffix Ki, Mi, Gi, Ti, k, M, G or T" $q) -}}
{{- end -}}
{{- $digits := regexFind "^[0-9]+" $q -}}
{{- $suffix := trimPrefix $digits $q -}}
{{- $mult := get (dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000) $suffix -}}
{{- mul (atoi $digits) $mult -}}
{{- end -}}
