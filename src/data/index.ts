/** The data pipeline: documents from files, packing into windows, train/val split, batch loading, the default corpus. */
export { loadDocuments, parseJsonlRecord, renderChatML, type ChatMessage } from './documents.js';
export { packDocuments, splitTrainVal, type PackOptions, type PackedData, type TokenEncoder, type Window } from './pack.js';
export { BatchLoader, type Batch, type BatchLoaderOptions, type LoaderState } from './loader.js';
export { loadDocCorpus, type DocCorpus, type DocCorpusOptions } from './doc-corpus.js';
